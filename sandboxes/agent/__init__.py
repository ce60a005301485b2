"""Craft's side of ACP: the protocol's messages (`protocol`), one agent process's conversation
(`connection`), and the cache of the live ones (`connections`)."""
