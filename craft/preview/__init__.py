"""Previews: an app served in a sandbox, shown to its owner on an origin of its own.

`origin` reads the preview origin (`CRAFT_PREVIEW_ORIGIN`) and tells its hosts; `passes` makes
and checks the token the page hands over and the cookie the preview origin keeps; `proxy` is
the ASGI application that serves a preview host (HTTP and websockets, streamed both ways) and
`frames` the websocket frames it speaks to the app. docs/workbench.md says what a person sees.
"""
