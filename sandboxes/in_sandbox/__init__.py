"""The programs Craft runs inside a sandbox, where the agent runs and with its rights: the demo
agent (`demo_agent`), the workspace tool (`workspace_tool`) and Craft's git (`git_tool`).

Each is one file of the standard library only (tests/sandboxes/in_sandbox/test_standard_library.py
checks it): the backends copy it, alone, into a sandbox's tools or the sandbox image, never
this package.
"""
