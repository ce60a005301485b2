"""The session runners of this process, and where commands for them come in."""

from __future__ import annotations

from uuid import UUID

from craft.commands import SessionCommand
from craft.storage import workers
from craft.turns.runner import SessionRunner


class RunnerRegistry:
    """The runners of this process, by session id (used from the event loop only)."""

    def __init__(self) -> None:
        self._runners: dict[UUID, SessionRunner] = {}
        self.closing = False  # shutting down: no new turns

    def get(self, session_id: UUID) -> SessionRunner:
        runner = self._runners.get(session_id)
        if runner is None:
            runner = self._runners[session_id] = SessionRunner(session_id, lambda: self.closing)
        return runner

    async def handle(self, session_id: UUID, command: SessionCommand, token: int) -> None:
        """Carry out a command of a session this worker owns under the lease `token`."""
        runner = self.get(session_id)
        runner.take_fence((workers.me().key, token))
        await runner.handle(command)

    async def lose(self, session_id: UUID) -> None:
        """This worker lost the session's lease: its runner stops the agent here."""
        await self.get(session_id).lose()

    def is_running(self, session_id: UUID) -> bool:
        runner = self._runners.get(session_id)
        return runner is not None and runner.running

    def running(self) -> list[SessionRunner]:
        return [runner for runner in self._runners.values() if runner.running]

    def forget(self, session_id: UUID) -> None:
        """Drop the runner of a session that is gone (its workspace's watch stopped now)."""
        runner = self._runners.pop(session_id, None)
        if runner is not None:
            runner.checkpoints.drop()

    def forget_all(self) -> None:
        """Drop every runner (this worker runs no session any more: it shut down), their
        workspaces' watches stopped now."""
        for session_id in list(self._runners):
            self.forget(session_id)


runners = RunnerRegistry()
