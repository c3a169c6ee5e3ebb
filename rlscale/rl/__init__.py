"""RL algorithms, their losses and advantages, the jitted update and its instruments."""
