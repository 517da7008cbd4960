"""Built-in providers.  Built-ins are providers like any site package."""
