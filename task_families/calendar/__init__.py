"""Earliest common free slot of several people, via a busy-slots calendar tool."""
