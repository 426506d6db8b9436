"""The pure core of one exchange: its intent, its state machine and the actions it asks for."""
