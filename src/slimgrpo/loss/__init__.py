"""slimgrpo.loss"""
