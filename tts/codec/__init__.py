"""Audio codecs: the FSQ mel codec and its vocoders (the default), the NeMo adapter, and `load.load_codec`, which
picks one by its folder's codec.json."""
