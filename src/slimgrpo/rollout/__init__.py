"""slimgrpo.rollout"""
