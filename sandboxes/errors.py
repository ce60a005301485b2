"""The error every sandbox backend raises when it cannot do what was asked.

It sits under the backends' interface (`sandboxes.backends.base`) and the workspace and
repository code it describes, so that those import it without importing the interface that
names their types.
"""


class SandboxError(Exception):
    """A backend could not do what was asked; the message is fit to show to the user."""
