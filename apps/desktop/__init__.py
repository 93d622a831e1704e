"""The desktop chat app (``edgeinfer desktop``), in Tkinter: it ships with Python, needs no
wheel of its own, and freezes with PyInstaller's own Tcl/Tk hooks."""
