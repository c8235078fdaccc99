"""Channel adapters: connect agents to chat platforms (see runtime.py for the flow)."""
