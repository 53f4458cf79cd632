"""slimgrpo.memory"""
