//! What an inference endpoint serves: the model, the model server's arguments and its
//! environment variables, as the launch form and the API take them and as every backend
//! hands them to the container (Kubernetes: the container's `args` and `env`; bare metal:
//! arguments after the image and variables through the runtime's env file on standard
//! input; the simulated fleet: its `/v1/models` names the model).
//!
//! Model servers differ in how they are told the model (vLLM: `--model`, TGI:
//! `--model-id`), so the model is also `BERTH_MODEL` in the environment, and `{model}` in
//! the arguments stands for it. With a model and no arguments, the arguments are
//! `--model {model}`, which vLLM's OpenAI server (and SGLang's `--model-path` alias aside,
//! most OpenAI-compatible servers) take.

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::catalog::Offering;

/// The longest model name taken (a Hugging Face id or a path in the image).
pub const MAX_MODEL: usize = 200;
/// The longest argument line taken, and the most arguments.
pub const MAX_ARGS_TEXT: usize = 2000;
pub const MAX_ARGS: usize = 64;
/// The most variables, the longest name and the longest value.
pub const MAX_ENV: usize = 50;
pub const MAX_ENV_NAME: usize = 64;
pub const MAX_ENV_VALUE: usize = 4096;

/// Variables Berth sets itself, which a launch may not set.
const OWN_VARIABLES: [&str; 3] = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "JUPYTER_TOKEN"];

/// An environment variable of the model server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// An inference endpoint's model, arguments and variables, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    pub model: Option<String>,
    /// As typed, split into words (`{model}` not yet replaced).
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
}

impl Serving {
    /// Reads the launch form's (or the API's) three fields for `offering`. Only inference
    /// endpoints take them: anything given for another offering is refused, so nothing
    /// typed is silently dropped.
    pub fn parse(offering: Offering, model: &str, args: &str, env: &str) -> Result<Serving, Refusal> {
        let (model, args, env) = (model.trim(), args.trim(), env.trim());
        if offering != Offering::InferenceEndpoint {
            if model.is_empty() && args.is_empty() && env.is_empty() {
                return Ok(Serving::default());
            }
            return Err(Refusal::ServingNotAllowed(offering.title()));
        }
        Ok(Serving { model: parse_model(model)?, args: split_args(args)?, env: parse_env(env)? })
    }

    /// The container's arguments: `{model}` replaced by the model; `--model <model>` when
    /// there is a model and no arguments.
    pub fn container_args(&self) -> Vec<String> {
        match (&self.model, self.args.is_empty()) {
            (Some(model), true) => vec!["--model".to_owned(), model.clone()],
            (Some(model), false) => self.args.iter().map(|a| a.replace("{model}", model)).collect(),
            (None, _) => self.args.clone(),
        }
    }

    /// The container's variables: the launch's, and `BERTH_MODEL` when there is a model.
    pub fn container_env(&self) -> Vec<EnvVar> {
        let model = self.model.iter().map(|m| EnvVar { name: "BERTH_MODEL".to_owned(), value: m.clone() });
        self.env.iter().cloned().chain(model).collect()
    }

    /// The variables' names, for pages and the API: values may be secrets (a token to
    /// download the model), so they are never shown back.
    pub fn env_names(&self) -> Vec<String> {
        self.env.iter().map(|v| v.name.clone()).collect()
    }
}

fn parse_model(model: &str) -> Result<Option<String>, Refusal> {
    if model.is_empty() {
        return Ok(None);
    }
    if model.len() > MAX_MODEL {
        return Err(Refusal::InvalidModel("must be at most 200 characters"));
    }
    if model.starts_with('-') {
        return Err(Refusal::InvalidModel("must not start with a hyphen"));
    }
    if !model.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c)) {
        return Err(Refusal::InvalidModel(
            "may use letters, digits and . _ - / : @ (a Hugging Face id such as meta-llama/Llama-3.1-8B-Instruct, or a path in the image)",
        ));
    }
    Ok(Some(model.to_owned()))
}

/// Splits an argument line into words as a shell would without expanding anything: spaces
/// separate words, single and double quotes group them (`--chat-template "a b"`), and a
/// backslash keeps the next character outside single quotes.
pub fn split_args(text: &str) -> Result<Vec<String>, Refusal> {
    let refuse = |why: &str| Err(Refusal::InvalidArguments(why.to_owned()));
    if text.len() > MAX_ARGS_TEXT {
        return refuse("must be at most 2000 characters");
    }
    if text.chars().any(|c| c.is_control() && c != '\t' && c != '\n') {
        return refuse("must not hold control characters");
    }
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return refuse("have a single quote that is not closed"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => w.push(c),
                            None => return refuse("end with a backslash"),
                        },
                        Some(c) => w.push(c),
                        None => return refuse("have a double quote that is not closed"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => return refuse("end with a backslash"),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    if words.len() > MAX_ARGS {
        return refuse("must be at most 64 words");
    }
    Ok(words)
}

impl EnvVar {
    /// Whether it can be one line of a runtime's env file as it is: a valid name that is
    /// not Berth's own, and a value without a line break. Checked again where a plan is
    /// carried out (the node agent), which trusts no line to add variables of its own.
    pub fn fits_env_file(&self) -> bool {
        let name = &self.name;
        !name.is_empty()
            && name.len() <= MAX_ENV_NAME
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !OWN_VARIABLES.contains(&name.as_str())
            && (name == "BERTH_MODEL" || !name.starts_with("BERTH_"))
            && !self.value.chars().any(|c| c.is_control() && c != '\t')
    }
}

/// Writes words back as one line `split_args` reads into the same words: a word with a
/// space, a quote or a backslash (or an empty one) in single quotes, a single quote as
/// `'\''`.
pub fn shell_words(words: &[String]) -> String {
    let plain = |w: &str| !w.is_empty() && !w.chars().any(|c| c.is_whitespace() || "'\"\\".contains(c));
    let quote = |w: &str| if plain(w) { w.to_owned() } else { format!("'{}'", w.replace('\'', "'\\''")) };
    words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

/// Reads `NAME=value` lines (blank lines and lines starting with `#` skipped).
fn parse_env(text: &str) -> Result<Vec<EnvVar>, Refusal> {
    let refuse = |why: String| Err(Refusal::InvalidEnv(why));
    let mut vars: Vec<EnvVar> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let Some((name, value)) = line.split_once('=') else {
            return refuse(format!("\"{}\" is not NAME=value", shorten(line)));
        };
        let (name, value) = (name.trim(), value.trim_start());
        let valid = name.len() <= MAX_ENV_NAME
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return refuse(format!(
                "\"{}\" is not a variable name (letters, digits and _, not starting with a digit, at most 64)",
                shorten(name)
            ));
        }
        if name.starts_with("BERTH_") || OWN_VARIABLES.contains(&name) {
            return refuse(format!("{name} is set by Berth"));
        }
        if vars.iter().any(|v| v.name == name) {
            return refuse(format!("{name} is given twice"));
        }
        if value.len() > MAX_ENV_VALUE {
            return refuse(format!("{name}'s value is longer than 4096 characters"));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return refuse(format!("{name}'s value holds control characters"));
        }
        vars.push(EnvVar { name: name.to_owned(), value: value.to_owned() });
    }
    if vars.len() > MAX_ENV {
        return refuse(format!("at most {MAX_ENV} variables"));
    }
    Ok(vars)
}

/// What is quoted back of a bad line: its start (it may hold a secret after its `=`).
fn shorten(text: &str) -> String {
    let kept: String = text.chars().take(24).collect();
    if kept.len() < text.len() { format!("{kept}…") } else { kept }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(model: &str, args: &str, env: &str) -> Result<Serving, Refusal> {
        Serving::parse(Offering::InferenceEndpoint, model, args, env)
    }

    #[test]
    fn a_model_alone_is_served_with_model_flag() {
        let s = serving("meta-llama/Llama-3.1-8B-Instruct", "", "").unwrap();
        assert_eq!(s.container_args(), ["--model", "meta-llama/Llama-3.1-8B-Instruct"]);
        assert_eq!(
            s.container_env(),
            [EnvVar { name: "BERTH_MODEL".into(), value: "meta-llama/Llama-3.1-8B-Instruct".into() }]
        );
    }

    #[test]
    fn arguments_split_as_a_shell_would_and_name_the_model() {
        let s = serving("org/m", r#"--model-id {model} --chat-template "a b" --x='c d' e\ f"#, "").unwrap();
        assert_eq!(s.args, ["--model-id", "{model}", "--chat-template", "a b", "--x=c d", "e f"]);
        assert_eq!(s.container_args(), ["--model-id", "org/m", "--chat-template", "a b", "--x=c d", "e f"]);
        assert_eq!(serving("", "--port 8000", "").unwrap().container_args(), ["--port", "8000"]);
        assert_eq!(split_args(r#""" ''"#).unwrap(), ["", ""], "empty quotes are words");
        for bad in [r#"--x "open"#, "--x 'open", r"--x \", "a\u{7}b"] {
            assert!(matches!(split_args(bad), Err(Refusal::InvalidArguments(_))), "{bad}");
        }
        assert!(split_args(&"a ".repeat(65)).is_err(), "too many words");
        // Written back for pages, the line reads into the same words.
        let words: Vec<String> = ["--x", "a b", "it's", "", r"c\d", "\"q\""].map(String::from).into();
        assert_eq!(shell_words(&words), r#"--x 'a b' 'it'\''s' '' 'c\d' '"q"'"#);
        assert_eq!(split_args(&shell_words(&words)).unwrap(), words);
    }

    #[test]
    fn variables_are_name_value_lines_and_berths_own_are_refused() {
        let s = serving("", "", "# a comment\nHF_TOKEN=hf_abc=def\n\n  MAX_BATCH = 8\n").unwrap();
        assert_eq!(
            s.env,
            [
                EnvVar { name: "HF_TOKEN".into(), value: "hf_abc=def".into() },
                EnvVar { name: "MAX_BATCH".into(), value: "8".into() },
            ]
        );
        assert_eq!(s.env_names(), ["HF_TOKEN", "MAX_BATCH"]);
        let refused = |env: &str| match serving("", "", env) {
            Err(Refusal::InvalidEnv(why)) => why,
            other => panic!("{env}: {other:?}"),
        };
        assert_eq!(refused("HF_TOKEN"), "\"HF_TOKEN\" is not NAME=value");
        assert!(refused("1X=2").contains("is not a variable name"));
        assert_eq!(refused("BERTH_API_KEY=x"), "BERTH_API_KEY is set by Berth");
        assert_eq!(refused("CUDA_VISIBLE_DEVICES=0"), "CUDA_VISIBLE_DEVICES is set by Berth");
        assert_eq!(refused("A=1\nA=2"), "A is given twice");
        assert!(refused(&format!("A={}", "x".repeat(4097))).contains("longer than 4096"));
        // A bad line is quoted by its start only: what follows may be a secret.
        assert_eq!(refused("hf_0123456789abcdefghijklmnop"), "\"hf_0123456789abcdefghijk…\" is not NAME=value");
    }

    #[test]
    fn models_are_ids_or_paths_and_only_endpoints_take_any_of_it() {
        assert!(serving("/models/llama", "", "").is_ok());
        for bad in ["-rf", "a b", "x;y", &"m".repeat(201)] {
            assert!(matches!(serving(bad, "", ""), Err(Refusal::InvalidModel(_))), "{bad}");
        }
        assert_eq!(Serving::parse(Offering::Notebook, "", " ", "").unwrap(), Serving::default());
        assert!(matches!(
            Serving::parse(Offering::TrainingJob, "org/m", "", ""),
            Err(Refusal::ServingNotAllowed("Training job"))
        ));
    }
}
