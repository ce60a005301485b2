"""HTTP plumbing: the request types, the ASGI handler and static files, the security headers,
browser sessions, the sign-in throttle and the health probes."""
