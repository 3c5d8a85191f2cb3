"""The lab: scenarios, simulated clients on the engine model, the oracle, summaries, plots and comparisons.

Everything here runs the production policy, controller and limiter on SimPy's clock, so a figure measured in the
lab is a figure of the code users run (docs/architecture.md).
"""
