"""Whether a trigger goes out, is held, or is refused: the runtime's trigger policy (issue 48).

Three rules, in the order a detection meets them:

- the gate (perftracker/runtime/trigger/gate.py): inside the detector, before a detection becomes a
  trigger (rate limit, a window already profiling the job);
- the hold (perftracker/runtime/trigger/defer.py): a detector's slowdown not yet worth a window is
  held and goes out later if it lasts (``due``);
- the budget (perftracker/runtime/window/budget.py): an automatic trigger goes out only when the
  window budget can pay for its window.

The Runtime owns one TriggerPolicy once its process trains (perftracker/runtime/activation.py) and
asks it before a trigger reaches the sink; the agent channel only carries what the runtime sends.
The cost meter the hold and the budget read (perftracker/runtime/window/cost.py) is the same one
that accounts for each window's cost; the channel reaches it through ``meter``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from perftracker.config import Config
from perftracker.runtime.protocols import WorkerIdentity
from perftracker.runtime.window.budget import CostBudget
from perftracker.runtime.window.cost import WindowCostMeter, ledger_path
from perftracker.warnonce import WarnOnce

log = logging.getLogger(__name__)


class PolicyRuntime(Protocol):
    """What the policy reads of the runtime: who it is (the ledger's name), its iterations."""

    @property
    def identity(self) -> WorkerIdentity: ...

    @property
    def iteration(self) -> int: ...

    def recent_iteration_ms(self) -> list[float]: ...


class TriggerPolicy:
    """The hold and the budget for one training process; never raises (a failure lets a trigger out)."""

    def __init__(self, runtime: PolicyRuntime, config: Config) -> None:
        self.runtime = runtime
        self.config = config
        self._meter: WindowCostMeter | None = None
        self._warn_once = WarnOnce(log)

    def meter(self) -> WindowCostMeter:
        """What this process's windows cost, and the budget (created on first use: the ledger file
        is named after the job and rank, settled by then)."""
        if self._meter is None:
            ident = self.runtime.identity
            self._meter = WindowCostMeter(self.runtime, ledger_path(self.config.run_dir, str(ident.job), int(ident.rank)),
                                          CostBudget(fraction=self.config.window_budget,
                                                     initial_s=self.config.window_budget_initial_s),
                                          hold=self.config.window_hold)
        return self._meter

    def metered(self) -> WindowCostMeter | None:
        """The meter if a window or a trigger has created it (for the exit's last accounting)."""
        return self._meter

    def admit(self, reason: str, detail: Mapping[str, object]) -> bool:
        """Whether a trigger goes out now: not held (worth a window, or manual) and within the budget."""
        return not self._held(reason, detail) and self._budget_allows(reason)

    def due(self) -> tuple[str, dict[str, object]] | None:
        """A held trigger that is now worth a window and within the budget: (reason, detail) to send."""
        try:
            if self._meter is None:
                return None  # nothing was ever held
            due = self._meter.due_held_trigger()
            if due is None or not self._budget_allows(due[0]):
                return None
            log.info("perftracker: %s trigger sent after %.1f s held (ratio now %.2f)", due[0],
                     due[1].get("deferred_s", 0.0), due[1].get("ratio_when_sent", 0.0))
            return due
        except Exception as exc:  # noqa: BLE001 - never into training
            self._warn_once("held-trigger", "perftracker: could not release a held trigger: %r", exc)
            return None

    def _held(self, reason: str, detail: Mapping[str, object]) -> bool:
        """A detector's slowdown not yet worth a window (window/budget.py worth) is held by the meter
        and sent later if it lasts; a failure of the meter sends it."""
        try:
            meter = self.meter()
            if meter.hold_if_not_worth(reason, detail):
                log.info("perftracker: %s trigger held until the slowdown is worth a window (%s)", reason,
                         meter.budget.to_dict(time.monotonic()))
                return True
        except Exception as exc:  # noqa: BLE001
            self._warn_once("budget-failed", "perftracker: window budget unavailable: %r", exc)
        return False

    def _budget_allows(self, reason: str) -> bool:
        """The window budget for a trigger; a failure of the meter allows it."""
        try:
            meter = self.meter()
            if meter.allows_trigger(reason):
                return True
            self._warn_once("budget", "perftracker: %s trigger not sent: the profile-window budget is spent (%s)",
                            reason, meter.budget.to_dict(time.monotonic()))
            return False
        except Exception as exc:  # noqa: BLE001
            self._warn_once("budget-failed", "perftracker: window budget unavailable: %r", exc)
            return True
