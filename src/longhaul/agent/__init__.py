"""Drive a policy through tasks into token-exact trajectories. For now single-turn
(`single_turn`); the multi-turn tool loop of the environments issue joins it here."""
