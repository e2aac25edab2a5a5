"""Drafters: the Drafter protocol, ngram, suffix/history and model drafters, DraftActor."""
