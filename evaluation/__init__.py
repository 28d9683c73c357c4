"""Evaluation: a finished checkpoint scored on a corpus (loss, perplexity, bits per byte, accuracy), under
`model.KEY=VALUE` settings that keep every weight. Sits between the commands (and the lab) and the trainer,
whose objective code it reuses."""
