"""The execution boundary: the one call a framework makes right before its agent starts, and
the two that update and release it (the names importable from `egress.boundary`)."""

from __future__ import annotations

from ..proxy.telemetry.observe import ExecutionSummary as ExecutionSummary
from .execution import CUT_MODES as CUT_MODES
from .execution import DNS_PORT as DNS_PORT
from .execution import PROXY_ENV as PROXY_ENV
from .execution import TRANSPARENT_PORT as TRANSPARENT_PORT
from .execution import CutMode as CutMode
from .execution import CutModeChoice as CutModeChoice
from .execution import Execution as Execution
from .execution import ExecutionNotReady as ExecutionNotReady
from .execution import Mode as Mode
from .execution import ReleaseFailed as ReleaseFailed
from .execution import agent_env as agent_env
from .gateway import Network as Network
from .lifecycle import prepare_execution as prepare_execution
from .lifecycle import release_execution as release_execution
from .lifecycle import update_execution as update_execution
