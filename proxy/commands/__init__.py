"""The commands a user runs: ``serve``, ``report``, ``bench``, ``demo`` and provisioning."""
