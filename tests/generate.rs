//! `dflash-top generate` with the language target of tests/reference/lm_target.py: the file's
//! shape, the stop at an end token, seeded sampling, and bad inputs that leave no file behind.

use crate::runs::assert_user_error;
use crate::support::{run, stderr};
use std::path::{Path, PathBuf};

pub fn lm_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference/lm");
    assert!(
        dir.join("target/model.safetensors").is_file(),
        "{} is missing: `make test` (or `make reference`) writes it with PyTorch + transformers",
        dir.display()
    );
    dir
}

pub fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(v: &serde_json::Value, key: &str) -> Vec<i64> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn generate(target: &Path, data: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "generate",
        "--target",
        target.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    run(&args)
}

/// A copy of the language target in `dir` whose generation_config names `stop_at` its end token.
fn target_ending_at(lm: &Path, dir: &Path, stop_at: i64) -> PathBuf {
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(lm.join("target").join(f), target.join(f)).unwrap();
    }
    std::fs::write(
        target.join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{stop_at}]}}"#),
    )
    .unwrap();
    target
}

fn prompts(dir: &Path, lines: &[&str]) -> PathBuf {
    let p = dir.join("prompts.jsonl");
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

#[test]
fn greedy_lines_hold_the_prompt_without_loss_and_stop_at_an_end_token() {
    let lm = lm_dir();
    let tmp = tempfile::tempdir().unwrap();
    let data = prompts(
        tmp.path(),
        &[
            r#"{"input_ids": [5, 30, 34, 40, 7, 19]}"#,
            r#"{"input_ids": [3, 9]}"#,
        ],
    );
    let out = tmp.path().join("out.jsonl");
    let o = generate(&lm.join("target"), &data, &out, &["--max-new-tokens", "12"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = lines(&out);
    assert_eq!(got.len(), 2);
    let first = ids(&got[0], "input_ids");
    assert_eq!(first[..6], [5, 30, 34, 40, 7, 19]);
    assert_eq!(first.len(), 6 + 12);
    let mask = ids(&got[0], "loss_mask");
    assert_eq!(mask, [vec![0; 6], vec![1; 12]].concat());
    assert!(!tmp.path().join("out.jsonl.tmp").exists());

    // The same target whose generation_config names the 4th new token as an end token: the
    // continuation stops right after it (the end token is kept, with loss).
    let stop_at = first[6 + 3];
    let target = target_ending_at(&lm, tmp.path(), stop_at);
    let o = generate(&target, &data, &out, &["--max-new-tokens", "12"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stopped = ids(&lines(&out)[0], "input_ids");
    let end = first[6..].iter().position(|&t| t == stop_at).unwrap() + 6 + 1;
    assert_eq!(stopped, first[..end].to_vec());
}

/// Ragged prompts decoded together give each prompt's own greedy continuation: padded on the
/// left, rows leaving the batch at an end token at different steps, in batches that divide the
/// file unevenly. A padding slot a query could see, or a row dropped from the cache in the wrong
/// order, changes some row's tokens.
#[test]
fn batched_greedy_output_is_each_prompt_decoded_alone() {
    let lm = lm_dir();
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<String> = (0..7)
        .map(|i| {
            let ids: Vec<i64> = (0..2 + 3 * i).map(|j| (j * 7 + i * 11) % 50 + 3).collect();
            format!(r#"{{"input_ids": {ids:?}}}"#)
        })
        .collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let data = prompts(tmp.path(), &rows);
    // An end token that the first prompt writes 5th: some rows stop early, others run on.
    let alone = tmp.path().join("alone.jsonl");
    let o = generate(
        &lm.join("target"),
        &data,
        &alone,
        &["--max-new-tokens", "24", "--batch", "1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let first = ids(&lines(&alone)[0], "input_ids");
    let stop_at = first[2 + 4];
    let target = target_ending_at(&lm, tmp.path(), stop_at);
    let decode = |batch: &str| {
        let out = tmp.path().join(format!("b{batch}.jsonl"));
        let o = generate(
            &target,
            &data,
            &out,
            &["--max-new-tokens", "24", "--batch", batch],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        lines(&out)
    };
    let one = decode("1");
    let new: Vec<i64> = one
        .iter()
        .map(|l| ids(l, "loss_mask").iter().sum())
        .collect();
    assert!(
        new.iter().min() < new.iter().max(),
        "rows stop at different steps: {new:?}"
    );
    for batch in ["3", "7"] {
        assert_eq!(decode(batch), one, "--batch {batch}");
    }
}

#[test]
fn sampling_follows_the_seed() {
    let lm = lm_dir();
    let tmp = tempfile::tempdir().unwrap();
    let data = prompts(tmp.path(), &[r#"{"input_ids": [5, 30, 34, 40, 7, 19]}"#]);
    let sample = |seed: &str, name: &str| {
        let out = tmp.path().join(name);
        let o = generate(
            &lm.join("target"),
            &data,
            &out,
            &[
                "--max-new-tokens",
                "40",
                "--temperature",
                "2",
                "--seed",
                seed,
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        ids(&lines(&out)[0], "input_ids")
    };
    let (a, b, c) = (sample("1", "a"), sample("1", "b"), sample("2", "c"));
    assert_eq!(a, b, "the same seed gives the same sample");
    assert_ne!(a, c, "another seed gives another sample");
}

#[test]
fn bad_generate_inputs_end_in_a_sentence_and_leave_no_file() {
    let lm = lm_dir();
    let target = lm.join("target");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    let good = r#"{"input_ids": [1, 2]}"#;

    let o = generate(
        &tmp.path().join("nope"),
        &prompts(tmp.path(), &[good]),
        &out,
        &[],
    );
    assert_user_error(&o, &["--target", "nope"]);

    let data = prompts(tmp.path(), &[good, "", r#"{"input_ids": [1, 2"#]);
    let o = generate(&target, &data, &out, &[]);
    assert_user_error(&o, &["prompts.jsonl line 3", "JSON"]);

    let data = prompts(tmp.path(), &[good, r#"{"input_ids": [1, 999]}"#]);
    let o = generate(&target, &data, &out, &[]);
    assert_user_error(&o, &["prompts.jsonl line 2", "999"]);

    let data = prompts(tmp.path(), &[r#"{"text": "hello"}"#]);
    let o = generate(&target, &data, &out, &[]);
    assert_user_error(&o, &["line 1", "tokenizer.json"]);

    let o = generate(
        &target,
        &prompts(tmp.path(), &[good]),
        &tmp.path().join("no/dir/out.jsonl"),
        &[],
    );
    assert_user_error(&o, &["--out", "no/dir/out.jsonl"]);

    let o = generate(
        &target,
        &prompts(tmp.path(), &[good]),
        &out,
        &["--temperature=-1"],
    );
    assert_user_error(&o, &["--temperature"]);

    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out"))
        .collect();
    assert!(left.is_empty(), "a failed run left {left:?}");
}

#[test]
fn chat_and_text_prompts_go_through_the_tokenizer_and_its_template() {
    let lm = lm_dir();
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(lm.join("target").join(f), target.join(f)).unwrap();
    }
    crate::engine::word_tokenizer(&target);
    let chat = r#"{"messages": [{"role": "user", "content": " how are you"}, {"role": "assistant", "content": "fine"}]}"#;
    let data = prompts(tmp.path(), &[r#"{"text": "hi there"}"#, chat]);
    let out = tmp.path().join("out.jsonl");
    // A tokenizer without a chat template refuses chat prompts, naming what is missing.
    let o = generate(&target, &data, &out, &[]);
    assert_user_error(
        &o,
        &[
            "prompts.jsonl line 2",
            "chat template",
            "target/tokenizer_config.json",
            "chat_template.jinja",
            "input_ids",
        ],
    );
    assert!(!out.exists());
    let template = r#"{% for m in messages %}
{{ '<|im_start|>' + m.role + ' ' + m.content.strip() + '<|im_end|>' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant there' }}{% endif %}"#;
    std::fs::write(
        target.join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let data = prompts(tmp.path(), &[chat, r#"{"text": "hi there"}"#]);
    let o = generate(&target, &data, &out, &["--max-new-tokens", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = lines(&out);
    // <|im_start|> user how are you <|im_end|>, then the generation prompt; the old answer is
    // not in it: the target writes its own.
    let chat = ids(&got[0], "input_ids");
    assert_eq!(chat[..9], [1, 3, 7, 8, 9, 2, 1, 4, 6]);
    assert_eq!(chat.len(), 12);
    assert_eq!(ids(&got[0], "loss_mask"), [vec![0; 9], vec![1; 3]].concat());
    assert_eq!(ids(&got[1], "input_ids")[..2], [5, 6]);
}
