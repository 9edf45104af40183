"""The node agent's options (perftracker.agent.daemon.daemon.AgentDaemon), in a module of their own:
the daemon's parts (perftracker.agent.daemon.localizer_link) read them without importing the daemon."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from perftracker.agent.daemon.window_session import WindowOptions


@dataclass(frozen=True)
class AgentOptions:
    run_dir: str
    agent_id: str = ""  # default: <host>-<pid>
    host: str = field(default_factory=socket.gethostname)
    poll_timeout_s: float = 20.0  # long-poll duration
    heartbeat_s: float = 2.0  # heartbeat period to the localizer
    register_debounce_s: float = 0.3  # gather workers registering together into one registration
    idle_exit_s: float = 0.0  # >0: exit when no worker has been connected this long (and nothing is running)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint; 0: any free port
    # None: the run dir and socket are this user's only (0700/0600). A gid: workers of another uid in
    # that group may connect (an agent running as root for nsys, a trainer as uid 10001): the run dir
    # becomes 0750 and the socket 0660 with that group, and windows/ 2770 (the workers write there).
    socket_gid: int | None = None
    window: WindowOptions = field(default_factory=WindowOptions)
