# The names and addresses of one engine run, sourced by up.sh, down.sh and leftovers.sh so
# that the three agree (docs/netcut.md#engines-in-ci). Every one can be chosen, so that a run
# coexists with the engines the machine runs itself and with another run that chose others:
#
#   NETCUT_CI_RUN      run directory: sockets, configuration, state   (default /run/netcut-ci)
#   NETCUT_CI_DATA     data directory: images, containers, the user's home (/var/lib/netcut-ci)
#   NETCUT_CI_NAME     podman's network, the run's user NAME-user and its group NAME-docker,
#                      the one that owns docker's socket                (default netcut-ci)
#   NETCUT_CI_BRIDGES  prefix of the run's bridges PREFIXdock0 (docker's default network),
#                      PREFIXdnet0 (docker's nc-ci), PREFIXpod0 (podman's)     (default nc)
#   NETCUT_CI_NET      N: the run's four /24s are 198.19.N.0 (docker's default network),
#                      N+1 (nc-ci), N+2 (podman's), N+3 (containerd's veths); N in 240..250,
#                      inside 198.19.240.0/20                                   (default 250)
# shellcheck shell=bash
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
DATA_DIR="${NETCUT_CI_DATA:-/var/lib/netcut-ci}"
CI_NAME="${NETCUT_CI_NAME:-netcut-ci}"
CI_BRIDGES="${NETCUT_CI_BRIDGES:-nc}"
CI_NET="${NETCUT_CI_NET:-250}"

instance_error() { echo "engines: $*" >&2; exit 2; }
[[ "$RUN_DIR" == /* && "$DATA_DIR" == /* && "$RUN_DIR" != "$DATA_DIR" ]] ||
    instance_error "NETCUT_CI_RUN and NETCUT_CI_DATA must be two absolute paths"
# NAME-docker and NAME-user are user and group names (at most 32 characters)
[[ "$CI_NAME" =~ ^[a-z][a-z0-9-]{0,24}$ ]] ||
    instance_error "NETCUT_CI_NAME=$CI_NAME: lowercase letters, digits and '-', at most 25"
# PREFIXdnet0 is a link name (at most 15 characters)
[[ "$CI_BRIDGES" =~ ^[a-z][a-z0-9]{0,9}$ ]] ||
    instance_error "NETCUT_CI_BRIDGES=$CI_BRIDGES: lowercase letters and digits, at most 10"
[[ "$CI_NET" =~ ^[0-9]{3}$ ]] && ((CI_NET >= 240 && CI_NET <= 250)) ||
    instance_error "NETCUT_CI_NET=$CI_NET: a number from 240 to 250 (198.19.N.0/24 and the next three; 198.19.254.0/24 is the boundary tests')"

DOCKER_BRIDGE="${CI_BRIDGES}dock0"
DOCKER_ADDR="198.19.$CI_NET.1"
DNET_BRIDGE="${CI_BRIDGES}dnet0"
DNET_ADDR="198.19.$((CI_NET + 1)).1"
POD_BRIDGE="${CI_BRIDGES}pod0"
POD_ADDR="198.19.$((CI_NET + 2)).1"
CTR_NET="198.19.$((CI_NET + 3))"
CI_BRIDGE_NAMES=("$DOCKER_BRIDGE" "$DNET_BRIDGE" "$POD_BRIDGE")
CI_USER="$CI_NAME-user"
CI_GROUP="$CI_NAME-docker"
