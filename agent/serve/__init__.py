"""Front-end: `s5 serve`, a streaming speech server with a browser page."""
