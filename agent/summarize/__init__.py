"""The summarizer (pure numpy): a raw window -> critical path -> (beta, mu, sigma) patterns per function."""
