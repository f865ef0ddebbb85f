"""What a load process runs on besides Locust: the garbage collector's control, waiting for a server, the child
servers it starts (the embedded emulator and its sidecar) and its private temp files. Below the plugin: nothing here
imports Locust or the plugin (``tests/test_layers.py``)."""
