"""`leapvox tui`: a Textual app to type text, speak it with live speed readouts, and keep a history."""
