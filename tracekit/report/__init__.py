"""Reports: text for the terminal (email, html and json come with issue 7)."""
