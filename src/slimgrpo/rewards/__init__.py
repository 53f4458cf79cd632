"""slimgrpo.rewards"""
