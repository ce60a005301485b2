"""The HTTP JSON API (docs/http-api.md): sessions, their events, the sandbox and keys
(`sessions`), a session's workspace files (`workspace`), going back (`going_back`), its git
repository (`repository`), search (`search`), previews (`preview`), and errors as JSON
(`errors`)."""
