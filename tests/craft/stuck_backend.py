"""The app served with a sandbox backend whose provisioning never leaves its API client.

Like a Kubernetes API that stops answering while a pod is created: the provisioning thread
never reaches its next progress report, so it cannot be told to stop. As in the kubernetes
client, each call runs inside pydantic's `validate_call` (Rust frames), and the thread wakes
often, so that it is awake while the interpreter finalizes, if the process lets it get there.

    daphne tests.craft.stuck_backend:application
"""

from __future__ import annotations

import time

from django.conf import settings
from pydantic import validate_call

from sandboxes.backends.local import LocalBackend


@validate_call
def call_the_api() -> None:
    time.sleep(0.001)  # an answer that is never the last one


class StuckBackend(LocalBackend):
    def provision(self, sandbox, progress) -> str:  # type: ignore[no-untyped-def]
        progress("creating the pod")
        while True:
            call_the_api()


settings.CRAFT_SANDBOX_BACKENDS = {
    **settings.CRAFT_SANDBOX_BACKENDS,
    "local": f"{__name__}.StuckBackend",
}

from craft.asgi import application  # noqa: E402  (after the backend is swapped)

__all__ = ["application"]
