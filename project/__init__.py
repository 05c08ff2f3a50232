"""Demo and test project for kumiko_jobs: settings, urls and the `project.demo` app."""
