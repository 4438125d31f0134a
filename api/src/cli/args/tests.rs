//! The flags' own tests: listen addresses and the help texts.

mod listen_tests {
    use super::super::parse_listen;

    /// `--listen localhost:7743` is taken (it was refused: only literal addresses parsed);
    /// what is not HOST:PORT is refused with an example.
    #[test]
    fn listen_takes_addresses_and_host_names() {
        assert_eq!(
            parse_listen("127.0.0.1:7700").unwrap().to_string(),
            "127.0.0.1:7700"
        );
        assert_eq!(
            parse_listen("[::1]:7700").unwrap().to_string(),
            "[::1]:7700"
        );
        let a = parse_listen("localhost:7743").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 7743, "{a}");
        for bad in ["localhost", "7700", "localhost:port", ""] {
            let e = parse_listen(bad).unwrap_err();
            assert!(
                e.contains("HOST:PORT") && e.contains("localhost:7700"),
                "{e}"
            );
        }
    }
}

mod help_tests {
    use clap::CommandFactory;

    /// Every argument of every command, recursively: (command path, argument id).
    fn unhelped(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            // clap's own `--help` and `--version` say what they do.
            if matches!(a.get_id().as_str(), "help" | "version") {
                continue;
            }
            let said = a
                .get_help()
                .or(a.get_long_help())
                .is_some_and(|h| !h.to_string().trim().is_empty());
            if !said {
                out.push(format!("{path} {}", a.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            // `bench` passes its arguments on to `tidemark-bench`, whose --help says them.
            unhelped(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// `tidemark deliveries list --sink`, `cursors reset --consumer` and `sources reset
    /// --watermark` (among others) showed no help at all in `--help`: an operator had to read
    /// the code to know what to pass. Every argument now says what it is.
    #[test]
    fn every_argument_has_help() {
        let mut missing = Vec::new();
        unhelped(&super::super::Cli::command(), "tidemark", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help:\n{}",
            missing.join("\n")
        );
    }
}
