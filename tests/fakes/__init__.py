"""Local stand-ins for chat platforms (HTTP/WebSocket fakes) and real-server launchers."""
