"""The package's version, on the ground floor: a report names it without importing the package's face (whose lazy
exports point at the plugin, an arrow up from ``report``)."""

__version__ = "0.1.0"
