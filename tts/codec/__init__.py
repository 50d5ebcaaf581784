"""Audio codecs: the FSQ mel codec voiced by HiFi-GAN (default), the WORLD-feature codec, the NeMo adapter,
and `load.load_codec`, which picks one by its folder's codec.json."""
