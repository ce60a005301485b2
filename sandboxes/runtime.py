"""What a process of `sandboxes` holds beyond the database, and how it lets go of it.

Its state lives in module singletons, each beside the code that uses it:

* `connections.agent_connections`: every agent process of this process (stopped here);
* `warm_agents.warm_agents`: warm agents kept ready (no more are started once stopping);
* `terminals.terminals`: open terminals, closed with their session or sandbox;
* `pipes.pipes`, `workspace.alarms`, `workspace.reaper`: one daemon thread each, started
  with their first use, that ends with the process;
* `reaper.periodic_reaper`: the reaper's passes, run by the server's lifecycle;
* thread pools, whose threads end with the process: the local backend's agent spawns and
  ends (`backends/local._spawner`, `backends/local._ends`), the network setup's
  (`backends/network._entering`) and terminals' ends (`terminals._ends`);
* `signals.sandbox_changed`: a signal, holding only the receivers wired at start.

`SandboxRuntime` stops what must be stopped, in order; the process's runtime above it
(`craft.runtime`, which composes this one: `sandboxes` never imports `craft`) calls it when
the server shuts down and when a test ends.
"""

from __future__ import annotations

from sandboxes.agent.connections import agent_connections


class SandboxRuntime:
    """Stop what this process of `sandboxes` holds: when it stops, or between tests."""

    def stop(self) -> int:
        """Start no more warm agents and stop every agent connection of this process, all at
        once (the process is stopping); return how many were stopped."""
        # Imported here: the warm agents read the models, and a test run without Django
        # resets this runtime too.
        from sandboxes.warm_agents import warm_agents

        warm_agents.close()
        return agent_connections.stop_all()

    def reset(self) -> None:
        """Stop every agent connection of this process (a test ended: the next starts its
        own); warm agents may still be started."""
        agent_connections.stop_all()


runtime = SandboxRuntime()
