"""slimgrpo.train"""
