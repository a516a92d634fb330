"""The commands that run the program: render, deploy, the offline engine."""
