"""Notebook 09 (fusion): the exercise's launch and check (:mod:`.paged_check`)."""
