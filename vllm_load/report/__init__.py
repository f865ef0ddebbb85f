"""Rendering a run: the console table, summary files, JUnit and exit code, the HTML report and sweep pages."""
