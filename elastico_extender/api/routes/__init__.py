"""One router per resource: extender verbs, REST state, webhook, operations."""
