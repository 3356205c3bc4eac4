"""Anchored text edits of a source file, for the scripts that rewrite a copy of a kernel
(stage_trace_edit.py, ring_stream_edit.py): each edit replaces text found exactly once, and
an anchor that is gone (the kernel changed) stops the script with the anchor's text."""
import sys


class Source:
    def __init__(self, path, tool):
        self.path = path
        self.tool = tool
        self.text = open(path).read()

    def edit(self, old, new):
        found = self.text.count(old)
        if found != 1:
            sys.exit(f"{self.tool}: anchor found {found} times, not once:\n{old}")
        self.text = self.text.replace(old, new)

    def save(self):
        open(self.path, "w").write(self.text)
