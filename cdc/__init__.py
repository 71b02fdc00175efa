"""Change data capture: database logs -> change events -> compacted topics -> derived stores."""

__version__ = "0.1.0"
