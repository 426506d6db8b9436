"""What the proxy says about itself: metrics, observers, admin endpoint, summaries."""
