"""The cut as data, pure: a namespace's state and the keeps in; the plan, its undo and the
verdict on a live namespace out, in words of its own (no netfilter backend's terms)."""
