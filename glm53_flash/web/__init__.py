"""The teaching layer's server: the course deck, its notes and text edits, and the live playground.

The server's default limits live here (not in server.py) so that `glm53 --help` can show them
without importing the web stack."""

MAX_CONNECTIONS = 64  # open connections at most; requests answer 503 once this many are open
HEADER_TIMEOUT = 10.0  # seconds from a request's first byte (or the connection's start) to its last header
BODY_TIMEOUT = 30.0  # seconds from the last header to the last body byte
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle keep-alive connection stays open
