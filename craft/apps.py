from django.apps import AppConfig


class CraftConfig(AppConfig):
    name = "craft"
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from craft import credentials
        from craft.checks import git_hosts_file, service_passwords
        from craft.cluster import forwarding
        from craft.live import accounts, delivery, status
        from craft.storage import eventlog
        from craft.turns.quiet import agent_stderr_changed
        from craft.turns.recovery import close_turns_taken_over
        from craft.turns.registry import runners
        from sandboxes.signals import sandbox_changed
        from sandboxes.warm_agents import warm_agents

        accounts.connect_signals()
        # What the event log commits reaches the sockets that follow it, and the owner's pages
        # when their list of sessions changes (the log sits below craft.live: it publishes, live
        # listens).
        eventlog.listen(
            eventlog.Listener(
                publish=delivery.publish,
                on_loop=delivery.hub,
                sessions_changed=status.sessions_changed,
            )
        )
        # A sandbox's new state is pushed to its owner's pages (craft.live.status).
        sandbox_changed.connect(status.on_sandbox_changed, dispatch_uid="craft.live.status")
        # What a quiet turn's agent last wrote to stderr reaches its owner's pages (the same).
        agent_stderr_changed.connect(status.on_agent_stderr, dispatch_uid="craft.live.status")
        # A session's commands, routed here by the cluster, are carried out by its runner; a
        # lease taken over closes the turns its previous owner left running.
        forwarding.serve(handle=runners.handle, lose=runners.lose, take_over=close_turns_taken_over)
        # A sandbox that becomes running warms its owner's likeliest agent (sandboxes.warm_agents).
        warm_agents.likely_launch = credentials.likely_launch
        checks.register(service_passwords, checks.Tags.security, deploy=True)
        checks.register(git_hosts_file)
