"""Chat sessions and their event log."""

import functools
import uuid

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import models
from django.db.models import Q
from django.utils import timezone

from sandboxes.models import Sandbox


class SessionQuerySet(models.QuerySet["Session"]):
    def owned_by(self, user: User | AnonymousUser) -> "SessionQuerySet":
        return self.filter(owner=user)

    def one_of(self, user: User | AnonymousUser, session_id: uuid.UUID | str) -> "Session | None":
        """Return `user`'s session `session_id` with its sandbox and whether a turn runs, or
        None: someone else's session and a missing one are not told apart."""
        sessions = self.owned_by(user).select_related("sandbox", "repository").with_running()
        try:
            # get(), not first(): first() adds an ordering by pk, more SQL to build for nothing.
            return sessions.get(pk=session_id)
        except Session.DoesNotExist:
            return None

    def recent_first(self) -> "SessionQuerySet":
        return self.order_by("-updated_at")

    def with_running(self) -> "SessionQuerySet":
        """Annotate `running`: whether the session has a running turn, in any worker."""
        return self.annotate(running=_running_turn())

    def with_status(self) -> "SessionQuerySet":
        """Annotate what the list of sessions shows (see `Session.state`): `running`,
        `awaiting` (the running turn waits for a permission answer), `last_stop` (the stop
        reason of the latest turn) and `unread` (a turn ended after its owner last looked)."""
        turns = TurnRecord.objects.filter(session=models.OuterRef("pk"))
        latest = turns.order_by("-prompt_seq").values("stop_reason")[:1]
        unseen = turns.filter(ended_at__gt=models.OuterRef("seen_at"))
        return self.with_running().annotate(
            awaiting=models.Exists(
                turns.filter(state=TurnRecord.State.RUNNING).exclude(pending={})
            ),
            last_stop=models.Subquery(latest),
            unread=models.Exists(unseen),
        )


@functools.cache
def _running_turn() -> models.Exists:
    """Whether the outer query's session has a running turn. Built once: building it is a
    fifth of the cost of a socket's session read; each query resolves its own copy."""
    turns = TurnRecord.objects.filter(session=models.OuterRef("pk"), state=TurnRecord.State.RUNNING)
    return models.Exists(turns)


class Session(models.Model):
    """A conversation with an agent, in its own workspace of its owner's sandbox."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="sessions")
    title = models.CharField(max_length=200, default="New session")
    # The catalog's agent it talks to (sandboxes.catalog), chosen when it was opened, for life.
    agent = models.CharField(max_length=64, default="default")
    # The id the agent gave this session in `session/new` (one per agent process).
    agent_session_id = models.CharField(max_length=200, blank=True)
    # Highest `Event.seq` handed out; bumped in the transaction that stores events.
    last_seq = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # How far its events are indexed for search (craft.storage.search): every turn that
    # ended up to this seq.
    search_indexed_seq = models.PositiveBigIntegerField(default=0)
    # When its owner last had its page in view: turns that ended since are unread.
    seen_at = models.DateTimeField(default=timezone.now)

    objects = SessionQuerySet.as_manager()
    running: bool  # only on sessions fetched `with_running()`

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title

    @property
    def state(self) -> str:
        """Return what the list of sessions says of it (a session fetched `with_status()`):
        `needs_approval`, `working`, `failed` (its latest turn ended with an error) or
        `idle`."""
        if self.running:
            return "needs_approval" if getattr(self, "awaiting", False) else "working"
        return "failed" if getattr(self, "last_stop", "") == "error" else "idle"


class EventQuerySet(models.QuerySet["Event"]):
    def after(self, seq: int) -> "EventQuerySet":
        return self.filter(seq__gt=seq).order_by("seq")


class Event(models.Model):
    """One thing that happened in a session, numbered in order (the session's record)."""

    # No index of its own: the unique (session, seq) index serves every lookup by session, and
    # one index less is less work for every stored token.
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    # The client's id of a prompt (`user_message` events only): a resent prompt is found by
    # this index, and the constraint refuses to store it twice.
    # NULL, not "": every other event has none, and NULLs stay out of the unique index.
    client_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_seq_unique_per_session"),
            models.UniqueConstraint(
                fields=["session", "client_id"],
                condition=Q(client_id__isnull=False),
                name="event_client_id_unique_per_session",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.kind}"


class Worker(models.Model):
    """A server process that runs turns; its identity is derived, never configured.

    `id` is "<host>/<pid>/<start>": the process's start time (clock ticks since boot) tells a
    pid apart from a later process that got the same pid. A worker refreshes `seen_at` while
    it runs and sets `stopped_at` when it shuts down cleanly.
    """

    id = models.CharField(primary_key=True, max_length=255)
    host = models.CharField(max_length=200)
    boot = models.CharField(max_length=64)  # the host's boot id: pids start over at boot
    pid = models.PositiveIntegerField()
    started = models.PositiveBigIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The worker's channel on the channel layer: frames for sessions it owns are sent there.
    channel = models.CharField(max_length=255, blank=True)
    # Where it listens for other workers' forwarded commands (host:port), if it does.
    peer = models.CharField(max_length=255, blank=True)

    def __str__(self) -> str:
        return self.id


class TurnRecordQuerySet(models.QuerySet["TurnRecord"]):
    def running(self) -> "TurnRecordQuerySet":
        return self.filter(state=TurnRecord.State.RUNNING)


class TurnRecord(models.Model):
    """One prompt and everything until its `turn_end`: the durable part of a running turn
    (the running one is `craft.turns.turn.Turn`).

    The event log keeps it up to date in the transactions that store the turn's events, and
    `craft.storage.eventlog.turn_rows` is the one module that writes it: a `user_message`
    with a client id starts it, `permission_request` and `permission_answer` (and
    `elicitation_request` and `elicitation_answer`) open and close entries of `pending`,
    `turn_end` ends it. A session has at most one running
    turn (a constraint, so that two workers can never start two).
    """

    class State(models.TextChoices):
        RUNNING = "running"
        ENDED = "ended"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    prompt_seq = models.PositiveBigIntegerField()
    worker = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    stop_reason = models.CharField(max_length=64, blank=True)
    # Open requests of the agent: request id -> the option ids a permission request offered,
    # or {"kind": "elicitation"} for a request for information.
    pending = models.JSONField(default=dict)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The workspace's checkpoints (commits of the session's store) around the turn: before
    # it, and after it when the turn used tools (blank: none taken). docs/workspace.md.
    checkpoint_before = models.CharField(max_length=64, blank=True)
    checkpoint_after = models.CharField(max_length=64, blank=True)

    objects = TurnRecordQuerySet.as_manager()

    class Meta:
        db_table = "craft_turn"  # the table of the model's first name, Turn
        ordering = ["session", "prompt_seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(state="running"),
                name="one_running_turn_per_session",
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id}@{self.prompt_seq} {self.state}"


class WorkspaceRevert(models.Model):
    """A revert of a session's workspace, stored as its `workspace_reverted` event at `seq`.

    Like a turn it is a change of the files between two checkpoints (docs/workspace.md), so
    it can be looked at and reverted in turn.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="reverts")
    seq = models.PositiveBigIntegerField()
    checkpoint_before = models.CharField(max_length=64)
    checkpoint_after = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="one_revert_per_event")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}@{self.seq} revert"


class QueuedPrompt(models.Model):
    """A prompt sent while its session was busy (a turn ran, the sandbox started), waiting to
    run in `position` order (docs/websocket-api.md, "Queued prompts").

    Every change is stored beside an event of the session in the same transaction
    (`prompt_queued`, `queued_prompt_edited`, `queued_prompt_removed`, `prompt_steered`), and a
    queued prompt starts by being deleted in the transaction that stores its `user_message`:
    it runs once, whichever worker starts it. `attachments` are the prompt's checked
    attachments as sent, images' data included (the log keeps only what they were).
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="queue")
    client_id = models.CharField(max_length=100)
    position = models.BigIntegerField()
    text = models.TextField()
    attachments = models.JSONField(default=list)
    queued_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "client_id"], name="one_queued_prompt_per_id"
            )
        ]
        indexes = [models.Index(fields=["session", "position"], name="queue_order")]

    def __str__(self) -> str:
        return f"{self.session_id} queued {self.client_id} at {self.position}"


class Lease(models.Model):
    """Which worker owns a session's agent, until when, under which fencing token.

    Only the owner starts the session's agent and stores its turns; frames that reach another
    worker are forwarded to it. The owner renews `expires_at` while it holds the agent. Another
    worker takes the lease over only once it has expired (or its owner is known to be gone),
    and every takeover increases `token`; the owner's writes carry its token and the event
    log refuses a stale one, so a worker that lost its lease (a long pause, a partition)
    stores nothing more for that session.
    """

    session = models.OneToOneField(
        Session, on_delete=models.CASCADE, primary_key=True, related_name="lease"
    )
    owner = models.CharField(max_length=255)
    token = models.PositiveBigIntegerField(default=1)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.session_id} owned by {self.owner} (token {self.token})"


class Credential(models.Model):
    """One of a person's own credentials for their agents (an API key), encrypted at rest.

    `ciphertext` is a Fernet token under CRAFT_SECRETS_KEY (craft.credentials); the value
    itself is never stored, shown or logged, and `hint` holds at most its last four
    characters. Only its owner's agents get it, in their environment.
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credentials"
    )
    name = models.CharField(max_length=64)  # the environment variable, e.g. ANTHROPIC_API_KEY
    ciphertext = models.TextField()
    hint = models.CharField(max_length=4, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="one_credential_per_name")
        ]

    def __str__(self) -> str:
        return f"{self.owner_id} {self.name}"


class GitToken(models.Model):
    """A person's token for one git host (craft.git_hosts), encrypted at rest like their
    agents' keys (craft.credentials): used by Craft's own git and the host's API for their
    sessions only, never shown again (`hint`), never given to an agent (docs/repositories.md).

    `login` is the account the host said the token belongs to when it was stored (some hosts
    want it as the user name beside the token).
    """

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="git_tokens"
    )
    host = models.CharField(max_length=255)  # as the hosts file names it: name or name:port
    ciphertext = models.TextField()
    hint = models.CharField(max_length=4, blank=True)
    login = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "host"], name="one_git_token_per_host")
        ]

    def __str__(self) -> str:
        return f"{self.owner_id} {self.host}"


class SessionRepository(models.Model):
    """The repository a session works on: cloned into its workspace before its first turn, on
    a branch of its own (docs/repositories.md).

    `status` is the clone's: `pending` (not begun), `cloning`, `setting_up`, `ready` or
    `failed` (`detail` says why, plainly; `failure` is the error code). Its pull request, once
    opened, is remembered with the state the host last reported.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        CLONING = "cloning"
        SETTING_UP = "setting_up"
        READY = "ready"
        FAILED = "failed"

    session = models.OneToOneField(
        Session, on_delete=models.CASCADE, primary_key=True, related_name="repository"
    )
    url = models.CharField(max_length=2000)
    host = models.CharField(max_length=255)
    path = models.CharField(max_length=1000)  # owner/name on the host
    # The branch it was cloned from (the remote's default when none was asked for), and the
    # session's own branch, created at the clone.
    base = models.CharField(max_length=255, blank=True)
    branch = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    detail = models.TextField(blank=True)
    failure = models.CharField(max_length=64, blank=True)
    commit = models.CharField(max_length=64, blank=True)  # what the clone checked out
    # The session branch's commit Craft last pushed ("" never): a push only moves it forward.
    pushed = models.CharField(max_length=64, blank=True)
    pull_request_url = models.CharField(max_length=2000, blank=True)
    pull_request_number = models.PositiveIntegerField(null=True, blank=True)
    pull_request_state = models.CharField(max_length=16, blank=True)  # open, merged, closed
    pull_request_checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.session_id} {self.url} ({self.status})"


class SearchEntry(models.Model):
    """Text of a session that search finds (craft.storage.search): a prompt, an agent's reply
    (its chunks joined), or a tool card (its title, command and output), with the event a
    match jumps to. Written after each turn, off the turn's way."""

    class Kind(models.TextChoices):
        PROMPT = "prompt"
        REPLY = "reply"
        TOOL = "tool"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="search_entries")
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    text = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="search_entry_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.kind}"
