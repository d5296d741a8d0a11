"""The HTTP edge: extender verbs, REST views, webhook, operations (see :mod:`.app`)."""
