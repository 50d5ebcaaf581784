"""Corpora: the offline teacher voices, manifests, cached features, tokenised utterances."""
