"""What a user reads: text reports and saved results (text), figures (figures)."""
