"""Events and triggers: the in-process event bus (`bus.py`), trigger patterns (`patterns.py`),
their rows and counters (`store.py`), the service that fires them (`service.py`) and the
manifest's `proactive` conditions (`manifest.py`)."""
