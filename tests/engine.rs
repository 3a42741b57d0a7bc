//! The engine on the CPU: packing, anchors, masks, labels, loss weights, shapes, a falling
//! loss, and bad inputs that must end in a sentence, not a panic.

use dflash_top::engine::data::{doc_ids_and_positions, Doc, DocSource, Packer, Rng};
use dflash_top::engine::model::drafter::Drafter;
use dflash_top::engine::model::qwen3::{document_causal_mask, Qwen3Target};
use dflash_top::engine::model::shapes::{drafter_spec_for, Qwen3Config};
use dflash_top::engine::train::blocks::*;
use dflash_top::engine::train::loss::{
    block_metrics, chunked_loss_backward, gamma_for, slot_weights,
};
use dflash_top::engine::train::presets::Preset;
use tch::{nn::VarStore, Device, Kind, Tensor};

fn vec_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.flatten(0, -1)).unwrap()
}

fn vec_bool(t: &Tensor) -> Vec<bool> {
    Vec::<bool>::try_from(t.flatten(0, -1)).unwrap()
}

#[test]
fn doc_ids_repeat_and_positions_restart_per_document() {
    let (docs, pos) = doc_ids_and_positions(&[3, 1, 2]);
    assert_eq!(vec_i64(&docs), vec![0, 0, 0, 1, 2, 2]);
    assert_eq!(vec_i64(&pos), vec![0, 1, 2, 0, 0, 1]);
}

struct Fixed(Vec<Doc>, usize);

impl DocSource for Fixed {
    fn next_doc(&mut self) -> anyhow::Result<Doc> {
        let d = self.0[self.1 % self.0.len()].clone();
        self.1 += 1;
        Ok(d)
    }

    fn position(&self) -> u64 {
        self.1 as u64
    }
}

fn doc(ids: &[i64]) -> Doc {
    Doc {
        ids: ids.to_vec(),
        loss_mask: vec![true; ids.len()],
    }
}

#[test]
fn packing_places_whole_documents_and_pads_the_rest_of_a_row() {
    let mut src = Fixed(vec![doc(&[1, 2, 3, 4, 5]), doc(&[6, 7, 8])], 0);
    let mut packer = Packer::new();
    let b = packer.pack(&mut src, 2, 6).unwrap();
    // [6,7,8] does not fit after [1..5]: it starts row 1; [1..5] then waits for the next batch.
    assert_eq!(
        vec_i64(&b.input_ids),
        vec![1, 2, 3, 4, 5, 0, 6, 7, 8, 0, 0, 0]
    );
    assert_eq!(
        vec_i64(&b.doc_ids),
        vec![0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1]
    );
    assert_eq!(
        vec_i64(&b.positions),
        vec![0, 1, 2, 3, 4, 0, 0, 1, 2, 0, 1, 2]
    );
    for i in [5, 9, 10, 11] {
        assert!(!b.host_loss_mask[i], "padding at {i} carries no loss");
    }
    assert_eq!(b.host_doc_ids, vec_i64(&b.doc_ids));
    assert_eq!(
        (b.docs_placed, b.truncated),
        (2, 0),
        "the third is still pending"
    );
    assert_eq!(
        b.doc_tokens,
        12 - 4,
        "the rows less their 4 tokens of padding"
    );
    let next = packer.pack(&mut src, 1, 6).unwrap();
    assert_eq!(vec_i64(&next.input_ids), vec![1, 2, 3, 4, 5, 0]);
    assert_eq!(next.docs_placed, 3);
}

#[test]
fn a_document_longer_than_a_row_is_truncated_and_counted_never_split() {
    let long: Vec<i64> = (1..=9).collect();
    let mut src = Fixed(vec![doc(&long), doc(&[20, 21])], 0);
    let mut packer = Packer::new();
    let b = packer.pack(&mut src, 2, 6).unwrap();
    assert_eq!(
        vec_i64(&b.input_ids),
        vec![1, 2, 3, 4, 5, 6, 20, 21, 0, 0, 0, 0],
        "the tail 7, 8, 9 is dropped, not a document of its own; the next long one waits"
    );
    assert_eq!(
        vec_i64(&b.positions),
        vec![0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3]
    );
    assert_eq!((b.truncated, b.docs_placed), (1, 2));
    assert_eq!(
        b.doc_tokens,
        6 + 2,
        "what was placed of the long one, and the short one"
    );
    let next = packer.pack(&mut src, 1, 6).unwrap();
    assert_eq!(vec_i64(&next.input_ids), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!((next.truncated, packer.truncated), (1, 2));
}

#[test]
fn every_packed_document_starts_at_position_zero_and_is_a_whole_source_document() {
    let docs: Vec<Doc> = (0..7i64)
        .map(|k| {
            doc(&(0..(3 + 5 * k) % 13 + 2)
                .map(|i| 100 * k + i + 1)
                .collect::<Vec<_>>())
        })
        .collect();
    let mut src = Fixed(docs.clone(), 0);
    let b = Packer::new().pack(&mut src, 5, 16).unwrap();
    let (ids, pos, mask) = (
        vec_i64(&b.input_ids),
        vec_i64(&b.positions),
        &b.host_loss_mask,
    );
    let mut seen = 0;
    for r in 0..5 {
        let end = (r + 1) * 16;
        let mut i = r * 16;
        while i < end {
            assert_eq!(pos[i], 0, "a segment starts at position 0");
            let len = (i + 1..end).take_while(|&j| pos[j] != 0).count() + 1;
            if mask[i] {
                assert_eq!(&ids[i..i + len], &docs[seen % 7].ids[..], "document {seen}");
                seen += 1;
            } else {
                assert!(ids[i..i + len].iter().all(|t| *t == 0), "padding");
            }
            i += len;
        }
    }
    assert_eq!(seen as u64, b.docs_placed);
}

#[test]
fn anchors_are_drawn_from_each_documents_candidates_within_the_budget() {
    // Two documents: [0..10) and [10..20); loss only from position 2 of each.
    let doc_ids: Vec<i64> = (0..20).map(|i| i / 10).collect();
    let mask: Vec<bool> = (0..20).map(|i| i % 10 >= 2).collect();
    let mut rng = Rng::new(1);
    let mut in_second = 0;
    for _ in 0..50 {
        let row = sample_anchors(&doc_ids, &mask, 3, AnchorScope::PerRow, &mut rng);
        let doc = sample_anchors(&doc_ids, &mask, 3, AnchorScope::PerDoc, &mut rng);
        for a in [&row, &doc] {
            assert!(
                a.windows(2).all(|w| w[0] < w[1]),
                "sorted, no repeats: {a:?}"
            );
            for &p in a.iter() {
                let p = p as usize;
                assert!(
                    mask[p] && mask[p + 1] && p / 10 == (p + 1) / 10,
                    "anchor {p}: no loss on it or on its next token in its document"
                );
            }
        }
        // Per row, the budget is the row's: three in all, whatever the number of documents.
        assert_eq!(row.len(), 3, "{row:?}");
        in_second += row.iter().filter(|&&p| p >= 10).count();
        // Per document, three in each.
        assert_eq!(doc.iter().filter(|&&p| p < 10).count(), 3, "{doc:?}");
        assert_eq!(doc.iter().filter(|&&p| p >= 10).count(), 3, "{doc:?}");
    }
    // Both documents get blocks of a row's budget, in proportion to their candidates (7 each).
    assert!(
        (50..=100).contains(&in_second),
        "{in_second} of 150 in the second"
    );
    // Every candidate is reachable, up to each document's second-last token (SpecForge's rule:
    // a block may run past the document's end).
    let all = sample_anchors(&doc_ids, &mask, 100, AnchorScope::PerDoc, &mut rng);
    assert_eq!(all, vec![2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18]);
    // The next token must carry loss: a lone loss token is no anchor.
    let lone = [false, true, false, true, true, true, true, true];
    assert_eq!(
        sample_anchors(&[0; 8], &lone, 100, AnchorScope::PerRow, &mut rng),
        vec![3, 4, 5, 6]
    );
}

/// A document's last tokens, its end token included, are labels at every block slot: anchors
/// near the end have blocks that run past it, whose slots there carry no label.
#[test]
fn the_end_token_is_a_label_at_every_slot() {
    let block = 4i64;
    // One document of 6 tokens, then padding: [0..6) loss everywhere, [6..10) padding.
    let doc_ids: Vec<i64> = (0..10).map(|i| (i >= 6) as i64).collect();
    let mask: Vec<bool> = (0..10).map(|i| i < 6).collect();
    let mut rng = Rng::new(3);
    let per_row = vec![sample_anchors(
        &doc_ids,
        &mask,
        100,
        AnchorScope::PerDoc,
        &mut rng,
    )];
    assert_eq!(per_row[0], vec![0, 1, 2, 3, 4]);
    let rows = label_rows(&per_row, 5, block as usize, &doc_ids, &mask, 10);
    // (anchor i, slot k) carries loss where anchor + k is in the document: the end token (5)
    // at slot 1 (anchor 4), 2 (anchor 3) and 3 (anchor 2).
    let end_slots: Vec<i64> = rows
        .iter()
        .map(|&r| (r / block, r % block))
        .filter(|&(i, k)| per_row[0][i as usize] + k == 5)
        .map(|(_, k)| k)
        .collect();
    assert_eq!(end_slots, vec![3, 2, 1]);
    // Nothing past the end: anchor 4's slots 2 and 3 and anchor 3's slot 3 carry none.
    assert_eq!(rows.len(), 3 + 3 + 3 + 2 + 1);
    // The device rule agrees with the host's.
    let ids = Tensor::arange(10, (Kind::Int64, Device::Cpu)).view([1, 10]);
    let docs = Tensor::from_slice(&doc_ids).view([1, 10]);
    let lmask = Tensor::from_slice(&mask).view([1, 10]);
    let a = anchors(&per_row[0], &[true; 5]);
    let (_, valid) = block_labels(&ids, &docs, &lmask, &a, block);
    let flat: Vec<bool> = Vec::try_from(valid.flatten(0, -1)).unwrap();
    let on: Vec<i64> = (0..flat.len() as i64)
        .filter(|&i| flat[i as usize])
        .collect();
    assert_eq!(on, rows);
}

fn anchors(pos: &[i64], valid: &[bool]) -> Anchors {
    let n = pos.len() as i64;
    Anchors {
        pos: Tensor::from_slice(pos).view([1, n]),
        valid: Tensor::from_slice(valid).view([1, n]),
        count: valid.iter().filter(|v| **v).count(),
    }
}

#[test]
fn block_mask_on_hand_made_cases() {
    // Row of 8: doc 0 = [0..5), doc 1 = [5..8). Blocks of 2 at anchors 0 (doc start), 3, 6, and
    // one padding block.
    let docs = Tensor::from_slice(&[0i64, 0, 0, 0, 0, 1, 1, 1]).view([1, 8]);
    let a = anchors(&[0, 3, 6, 0], &[true, true, true, false]);
    let m = block_mask(&docs, &a, 2);
    assert_eq!(m.size(), vec![1, 1, 8, 16]);
    let row = |q: i64| -> Vec<bool> { vec_bool(&m.get(0).get(0).get(q)) };
    let ctx = |r: &[bool]| r[..8].to_vec();
    let blocks = |r: &[bool]| r[8..].to_vec();
    let f = false;
    let t = true;
    // Anchor 0: no context (nothing before it), its own block both ways.
    assert_eq!(ctx(&row(0)), vec![f; 8]);
    assert_eq!(blocks(&row(0)), vec![t, t, f, f, f, f, f, f]);
    assert_eq!(blocks(&row(1)), vec![t, t, f, f, f, f, f, f]);
    // Anchor 3: context 0,1,2 (before it, same doc), never another block.
    assert_eq!(ctx(&row(2)), vec![t, t, t, f, f, f, f, f]);
    assert_eq!(blocks(&row(3)), vec![f, f, t, t, f, f, f, f]);
    // Anchor 6: context only its own document (5), not doc 0.
    assert_eq!(ctx(&row(4)), vec![f, f, f, f, f, t, f, f]);
    // The padding block sees nothing at all.
    assert!(row(6).iter().chain(row(7).iter()).all(|x| !x));
}

#[test]
fn labels_follow_the_anchor_and_stop_at_document_and_row_ends() {
    let ids = Tensor::from_slice(&[10i64, 11, 12, 13, 14, 20, 21, 22]).view([1, 8]);
    let docs = Tensor::from_slice(&[0i64, 0, 0, 0, 0, 1, 1, 1]).view([1, 8]);
    let lmask = Tensor::from_slice(&[t(), t(), t(), false, t(), t(), t(), t()]).view([1, 8]);
    let a = anchors(&[2, 6], &[true, true]);
    let (labels, valid) = block_labels(&ids, &docs, &lmask, &a, 4);
    assert_eq!(vec_i64(&labels.get(0).get(0)), vec![12, 13, 14, 20]);
    // slot 0 never; 13 outside the loss mask; 20 is another document.
    assert_eq!(
        vec_bool(&valid.get(0).get(0)),
        vec![false, false, true, false]
    );
    // Anchor 6: slot 1 = 22, then past the row.
    assert_eq!(
        vec_bool(&valid.get(0).get(1)),
        vec![false, true, false, false]
    );
    let inputs = block_input_ids(&ids, &a, 4, 99);
    assert_eq!(vec_i64(&inputs), vec![12, 99, 99, 99, 21, 99, 99, 99]);
    let pos = Tensor::from_slice(&[0i64, 1, 2, 3, 4, 0, 1, 2]).view([1, 8]);
    assert_eq!(
        vec_i64(&block_positions(&pos, &a, 4)),
        vec![2, 3, 4, 5, 1, 2, 3, 4]
    );
}

fn t() -> bool {
    true
}

#[test]
fn loss_weights_decay_from_slot_one_and_skip_slot_zero() {
    let w = slot_weights(16, gamma_for(16));
    assert_eq!(w[0], 0.0);
    assert!((w[1] - 1.0).abs() < 1e-7);
    assert!(
        (w[8] - (-1.0f32).exp()).abs() < 1e-6,
        "exp(-(8-1)/7) = e^-1"
    );
    assert!(w.windows(2).skip(1).all(|p| p[1] < p[0]));
    assert_eq!(gamma_for(10), 5.0);
    assert_eq!(gamma_for(8), 4.0);
}

#[test]
fn target_mask_is_causal_within_each_document() {
    let docs = Tensor::from_slice(&[0i64, 0, 1, 1]).view([1, 4]);
    let m = document_causal_mask(&docs, None);
    let rows: Vec<Vec<bool>> = (0..4).map(|q| vec_bool(&m.get(0).get(0).get(q))).collect();
    assert_eq!(rows[1], vec![true, true, false, false]);
    assert_eq!(rows[2], vec![false, false, true, false]);
    assert_eq!(rows[3], vec![false, false, true, true]);
    let w = document_causal_mask(&Tensor::zeros([1, 4], (Kind::Int64, Device::Cpu)), Some(2));
    assert_eq!(
        vec_bool(&w.get(0).get(0).get(3)),
        vec![false, false, true, true]
    );
}

fn tiny() -> (Qwen3Config, dflash_top::engine::model::shapes::DrafterSpec) {
    let p = Preset::by_name("tiny").unwrap();
    let spec = p.drafter_spec(&p.target);
    (p.target, spec)
}

#[test]
fn shapes_through_target_drafter_and_loss() {
    tch::manual_seed(0);
    let (cfg, spec) = tiny();
    let vs = VarStore::new(Device::Cpu);
    let target = Qwen3Target::new(&vs.root(), &cfg, &spec.target_layer_ids, 0.5);
    let (b, s) = (2, 32);
    let ids = Tensor::randint(500, [b, s], (Kind::Int64, Device::Cpu));
    let docs = Tensor::zeros([b, s], (Kind::Int64, Device::Cpu));
    let pos = Tensor::arange(s, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([b, 1]);
    let hidden = tch::no_grad(|| target.forward(&ids, &pos, &docs));
    assert_eq!(hidden.size(), vec![b, s, 2 * cfg.hidden_size]);

    let dvs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&dvs.root(), &spec);
    let a = Anchors {
        pos: Tensor::from_slice(&[4i64, 9, 3, 0]).view([2, 2]),
        valid: Tensor::from_slice(&[true, true, true, false]).view([2, 2]),
        count: 3,
    };
    let block = spec.block_size;
    let block_ids = block_input_ids(&ids, &a, block, spec.mask_token_id);
    let emb = Tensor::embedding(&target.embed_tokens, &block_ids, -1, false, false).detach();
    let mask = block_mask(&docs, &a, block);
    let out = drafter.forward(
        &hidden,
        &pos,
        &emb,
        &block_positions(&pos, &a, block),
        &mask,
    );
    assert_eq!(out.size(), vec![b, 2 * block, cfg.hidden_size]);
    // The padding block's rows are fully masked: finite, never NaN.
    assert!(bool::try_from(out.isfinite().all()).unwrap());

    let lmask = Tensor::ones([b, s], (Kind::Bool, Device::Cpu));
    let (labels, valid) = block_labels(&ids, &docs, &lmask, &a, block);
    let w = slot_weights(block, gamma_for(block));
    let (loss, backward) = chunked_loss_backward(&out, &target.lm_head, &labels, &valid, &w, 7);
    backward();
    let l = f32::try_from(&loss.loss).unwrap();
    assert!(l.is_finite() && l > 0.0);
    let grads: Vec<f64> = dvs
        .trainable_variables()
        .iter()
        .map(|v| f64::try_from(v.grad().abs().sum(Kind::Float)).unwrap())
        .collect();
    assert!(grads.iter().all(|g| g.is_finite()) && grads.iter().any(|g| *g > 0.0));
    let (acc, tau) = block_metrics(&loss.correct, &valid, &a.valid);
    assert_eq!(acc.size(), vec![block]);
    assert!(f32::try_from(&tau).unwrap() >= 1.0);
}

/// One document trained in a row of its own length and at the end of a row of 4,096 tokens
/// (above the 3,072 the rows were once capped at), behind other documents: the target's hidden
/// states over it, the drafter's output on its blocks (the tiled attention a training step
/// runs) and the loss of those blocks agree. Nothing in a long row reaches across documents.
#[test]
fn a_document_at_the_end_of_a_long_row_trains_as_in_a_row_of_its_own() {
    tch::manual_seed(21);
    let (cfg, spec) = tiny();
    let (vs, dvs) = (VarStore::new(Device::Cpu), VarStore::new(Device::Cpu));
    let target = Qwen3Target::new(&vs.root(), &cfg, &spec.target_layer_ids, 0.5);
    let drafter = Drafter::new(&dvs.root(), &spec);
    let block = spec.block_size;
    let (doc_len, long) = (48i64, 4096i64);
    let doc = Tensor::randint(500, [doc_len], (Kind::Int64, Device::Cpu));
    let offset = long - doc_len;
    // Documents of 1,000 tokens before it in the long row, the last one shorter.
    let mut host_docs: Vec<i64> = (0..offset).map(|i| i / 1000).collect();
    host_docs.extend(std::iter::repeat_n(99, doc_len as usize));
    let host_pos: Vec<i64> = (0..long)
        .map(|i| if i < offset { i % 1000 } else { i - offset })
        .collect();
    let filler = Tensor::randint(500, [offset], (Kind::Int64, Device::Cpu));
    let row = |ids: Tensor, docs: &[i64], pos: &[i64]| {
        let n = pos.len() as i64;
        (
            ids.view([1, n]),
            Tensor::from_slice(docs).view([1, n]),
            Tensor::from_slice(pos).view([1, n]),
        )
    };
    let short_pos: Vec<i64> = (0..doc_len).collect();
    let short = row(doc.copy(), &vec![0; doc_len as usize], &short_pos);
    let long_row = row(Tensor::cat(&[&filler, &doc], 0), &host_docs, &host_pos);
    // The same anchors in the document (+ its offset in the long row).
    let run = |(ids, docs, pos): &(Tensor, Tensor, Tensor), shift: i64, at: [i64; 3]| {
        let host_docs = vec_i64(docs);
        let per_row = vec![at.map(|p| p + shift).to_vec()];
        let a = anchors(&per_row[0], &[true; 3]);
        let hidden = tch::no_grad(|| target.forward(ids, pos, docs));
        let emb = Tensor::embedding(
            &target.embed_tokens,
            &block_input_ids(ids, &a, block, spec.mask_token_id),
            -1,
            false,
            false,
        )
        .detach();
        let mask = dflash_top::engine::model::tiled::AttnMask::Tiled(tiled_block_mask(
            docs, &a, block, &per_row, &host_docs,
        ));
        let out =
            drafter.forward_masked(&hidden, pos, &emb, &block_positions(pos, &a, block), &mask);
        let lmask = Tensor::ones_like(ids).to_kind(Kind::Bool);
        let (labels, valid) = block_labels(ids, docs, &lmask, &a, block);
        let w = slot_weights(block, gamma_for(block));
        let (loss, _) = chunked_loss_backward(&out, &target.lm_head, &labels, &valid, &w, 7);
        let doc_hidden = hidden.narrow(1, shift, doc_len);
        (doc_hidden, out.detach(), f64::try_from(&loss.loss).unwrap())
    };
    let (h_short, out_short, loss_short) = run(&short, 0, [3, 17, 30]);
    let (h_long, out_long, loss_long) = run(&long_row, offset, [3, 17, 30]);
    assert!(
        h_long.allclose(&h_short, 1e-4, 1e-5, false),
        "target hidden states differ"
    );
    assert!(
        out_long.allclose(&out_short, 1e-4, 1e-5, false),
        "drafter outputs differ"
    );
    assert!(
        (loss_long - loss_short).abs() < 1e-4 * loss_short.abs(),
        "{loss_long} vs {loss_short}"
    );
    // The check can fail: the same anchors one token later give another loss.
    let (_, _, moved) = run(&long_row, offset, [4, 18, 31]);
    assert!((moved - loss_short).abs() > 1e-3, "{moved} vs {loss_short}");
}

#[test]
fn chunking_does_not_change_the_loss_or_its_gradient() {
    tch::manual_seed(3);
    let (b, a, block, h, v) = (1, 3, 4, 8, 50);
    let hidden =
        Tensor::randn([b, a * block, h], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let head = Tensor::randn([v, h], (Kind::Float, Device::Cpu));
    let labels = Tensor::randint(v, [b, a, block], (Kind::Int64, Device::Cpu));
    let valid = Tensor::rand([b, a, block], (Kind::Float, Device::Cpu)).gt(0.3);
    let w = slot_weights(block, 2.0);
    let run = |chunk: i64| {
        let x = hidden.detach().set_requires_grad(true);
        let (out, backward) = chunked_loss_backward(&x, &head, &labels, &valid, &w, chunk);
        backward();
        (f64::try_from(&out.loss).unwrap(), x.grad())
    };
    let (l1, g1) = run(1);
    let (l_all, g_all) = run(1000);
    assert!((l1 - l_all).abs() < 1e-5);
    assert!(g1.allclose(&g_all, 1e-5, 1e-6, false));
    // Against a direct weighted cross-entropy.
    let logits = hidden.detach().matmul(&head.tr()).view([-1, v]);
    let nll = logits
        .log_softmax(-1, Kind::Float)
        .gather(1, &labels.view([-1, 1]), false)
        .view([-1])
        .neg();
    let wt = (valid.to_kind(Kind::Float) * Tensor::from_slice(&w).view([1, 1, block])).view([-1]);
    let direct = f64::try_from((nll * &wt).sum(Kind::Float) / wt.sum(Kind::Float)).unwrap();
    assert!((l1 - direct).abs() < 1e-5, "{l1} vs {direct}");
    // Nothing that counts: zero loss, zero gradient, no NaN.
    let none = Tensor::zeros([b, a, block], (Kind::Bool, Device::Cpu));
    let x = hidden.detach().set_requires_grad(true);
    let (out, backward) = chunked_loss_backward(&x, &head, &labels, &none, &w, 4);
    backward();
    assert_eq!(f64::try_from(&out.loss).unwrap(), 0.0);
}

/// The loss in bf16 (as on the GPU) against the same loss in f64, on rows the drafter gets right
/// with near certainty: there the label's gradient entry `p - 1` is far smaller than bf16's
/// spacing near 1, and the row's gradient is only right if that entry is not rounded away.
#[test]
fn the_bf16_loss_keeps_the_gradient_of_confident_rows() {
    bf16_loss_against_f64(Device::Cpu);
}

/// The same on the GPU (its softmax and reductions are other kernels); skipped without one.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn the_bf16_loss_keeps_the_gradient_of_confident_rows_on_cuda() {
    if let Some(dev) = crate::cuda_or_skip("the bf16 loss on CUDA") {
        bf16_loss_against_f64(dev);
    }
}

fn bf16_loss_against_f64(dev: Device) {
    tch::manual_seed(11);
    let (a, block, h, v) = (4, 4, 32, 300);
    let n = a * block;
    let head = Tensor::randn([v, h], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
    // Each row points at its label's head row, scaled so that p(label) goes from ~0.5 to
    // 1 - 1e-4 across the rows.
    let labels = Tensor::randint(v, [1, a, block], (Kind::Int64, Device::Cpu));
    let sharp = Tensor::linspace(0.02, 0.6, n, (Kind::Float, Device::Cpu)).view([n, 1]);
    let x = (head
        .to_kind(Kind::Float)
        .index_select(0, &labels.view([-1]))
        * sharp
        + Tensor::randn([n, h], (Kind::Float, Device::Cpu)) * 0.1)
        .to_kind(Kind::BFloat16)
        .view([1, n, h]);
    let valid = Tensor::ones([1, a, block], (Kind::Bool, Device::Cpu));
    let w = slot_weights(block, 2.0);

    let on = |t: &Tensor| t.to_device(dev);
    let xb = on(&x).set_requires_grad(true);
    let (out, backward) = chunked_loss_backward(&xb, &on(&head), &on(&labels), &on(&valid), &w, 5);
    backward();
    let ours = xb
        .grad()
        .to_device(Device::Cpu)
        .to_kind(Kind::Double)
        .view([n, h]);
    let ours_loss = f64::try_from(&out.loss.to_device(Device::Cpu)).unwrap();

    // f64 reference from the same bf16 logits (a bf16 matmul's output on the same device, as
    // both paths have it).
    let head64 = head.to_kind(Kind::Double);
    let logits = on(&x)
        .view([n, h])
        .matmul(&on(&head).tr())
        .to_device(Device::Cpu)
        .to_kind(Kind::Double);
    let p = logits.softmax(-1, Kind::Double);
    let p_label = p.gather(1, &labels.view([n, 1]), false).view([n]);
    let wt = (valid.to_kind(Kind::Double)
        * Tensor::from_slice(&w)
            .to_kind(Kind::Double)
            .view([1, 1, block]))
    .view([n]);
    let denom = wt.sum(Kind::Double);
    let loss = f64::try_from((p_label.log().neg() * &wt).sum(Kind::Double) / &denom).unwrap();
    let onehot = Tensor::zeros([n, v], (Kind::Double, Device::Cpu)).scatter_value(
        1,
        &labels.view([n, 1]),
        1.0,
    );
    let want = (p - onehot).matmul(&head64) * (&wt / &denom).view([n, 1]);

    let most_confident = f64::try_from(p_label.max()).unwrap();
    assert!(
        most_confident > 0.9995,
        "the rows do not reach the regime under test (max p = {most_confident})"
    );
    assert!(
        (ours_loss - loss).abs() < 2e-3 * loss.max(1e-3),
        "loss {ours_loss} vs {loss}"
    );
    // Every row's gradient within 3% of its own size, the confident ones included (slot 0
    // carries no weight: exactly zero), down to f32's floor: the row sum near 1 has a spacing of
    // 6e-8, so `1 - p` below ~1e-6 is not resolved (nor was it by the f32 loss before).
    let row_scale = (wt / denom).view([n]);
    for r in 0..n {
        let (g, t) = (ours.get(r), want.get(r));
        let err = f64::try_from((&g - &t).norm()).unwrap();
        let size = f64::try_from(t.norm()).unwrap();
        let floor = 1e-6 * f64::try_from(row_scale.get(r)).unwrap() * (h as f64).sqrt();
        assert!(
            err <= 0.03 * size + floor,
            "row {r}: gradient off by {err} of {size}"
        );
    }
}

#[test]
fn drafter_spec_follows_the_target() {
    let p = Preset::by_name("qwen3-8b").unwrap();
    let s = drafter_spec_for(&p.target, 5, 151_669, 16);
    assert_eq!(s.target_layer_ids, vec![1, 9, 17, 25, 33]);
    assert_eq!(s.layers.hidden_size, 4096);
}

/// JSONL options with the vocabulary of `word_tokenizer` and its tokenizer.json.
fn with_tokenizer(tok: &std::path::Path) -> dflash_top::engine::data::jsonl::JsonlOptions {
    dflash_top::engine::data::jsonl::JsonlOptions {
        tokenizer: Some(tok.to_path_buf()),
        ..dflash_top::engine::data::jsonl::JsonlOptions::new(512)
    }
}

pub fn word_tokenizer(dir: &std::path::Path) -> std::path::PathBuf {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::{AddedToken, Tokenizer};
    let words = [
        "[UNK]",
        "<|im_start|>",
        "<|im_end|>",
        "user",
        "assistant",
        "hi",
        "there",
        "how",
        "are",
        "you",
        "fine",
    ];
    let vocab = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    tok.add_special_tokens(&[
        AddedToken::from("<|im_start|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    let path = dir.join("tokenizer.json");
    tok.save(&path, false).unwrap();
    path
}

#[test]
fn chat_lines_are_tokenized_with_loss_on_assistant_turns_only() {
    use dflash_top::engine::data::jsonl::JsonlOptions;
    use dflash_top::engine::data::jsonl::JsonlSource;
    let dir = tempfile::tempdir().unwrap();
    let tok = word_tokenizer(dir.path());
    let data = dir.path().join("chat.jsonl");
    std::fs::write(
        &data,
        concat!(
            r#"{"messages": [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": "fine"}]}"#,
            "\n",
            r#"{"text": "hi there"}"#,
            "\n"
        ),
    )
    .unwrap();
    // Without a chat template, chat lines are refused with a sentence naming what is missing.
    let e = format!(
        "{:#}",
        JsonlSource::open(&data, with_tokenizer(&tok))
            .err()
            .unwrap()
    );
    assert!(
        e.contains("chat.jsonl line 1")
            && e.contains("chat template")
            && e.contains("tokenizer_config.json")
            && e.contains("input_ids"),
        "{e}"
    );
    // With ChatML as the tokenizer's template.
    let chatml = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + \
                  '<|im_end|>\\n' }}{% endfor %}";
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": chatml }).to_string(),
    )
    .unwrap();
    let mut src = JsonlSource::open(&data, with_tokenizer(&tok)).unwrap();
    let chat = src.next_doc().unwrap();
    // <|im_start|> user how are you <|im_end|> <|im_start|> assistant fine <|im_end|>
    assert_eq!(chat.ids, vec![1, 3, 7, 8, 9, 2, 1, 4, 10, 2]);
    assert_eq!(
        chat.loss_mask,
        vec![false, false, false, false, false, false, false, false, true, true]
    );
    let text = src.next_doc().unwrap();
    assert_eq!(text.ids, vec![5, 6]);
    assert_eq!(text.loss_mask, vec![true, true]);
    // Without a tokenizer: a sentence that says what to give.
    let e = format!(
        "{:#}",
        JsonlSource::open(&data, JsonlOptions::new(512))
            .err()
            .unwrap()
    );
    assert!(
        e.contains("--target") && e.contains("tokenizer.json"),
        "{e}"
    );
}

#[test]
fn sliding_layers_drop_keys_beyond_the_window_and_later_block_slots() {
    use dflash_top::engine::model::drafter::sliding;
    // One block of 2 at anchor 5 over a row of 6: context keys 0..5, block keys at 5, 6.
    let docs = Tensor::zeros([1, 6], (Kind::Int64, Device::Cpu));
    let a = anchors(&[5], &[true]);
    let mask = block_mask(&docs, &a, 2);
    let pos = Tensor::arange(6, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let bpos = block_positions(&pos, &a, 2);
    let all = Tensor::cat(&[&pos, &bpos], 1);
    let m = sliding(&mask, &bpos, &all, Some(3));
    // Query at position 6 (slot 1): context 4 (distance 2) stays, 3 (distance 3) goes.
    assert_eq!(
        vec_bool(&m.get(0).get(0).get(1)),
        vec![false, false, false, false, true, false, true, true]
    );
    // Slot 0 (position 5) does not see slot 1 (position 6): causal inside the block, as dflash
    // runs a sliding layer; without a window, every earlier context key stays.
    assert_eq!(
        vec_bool(&m.get(0).get(0).get(0)),
        vec![false, false, false, true, true, false, true, false]
    );
    let unbounded = sliding(&mask, &bpos, &all, None);
    assert_eq!(
        vec_bool(&unbounded.get(0).get(0).get(0)),
        vec![true, true, true, true, true, false, true, false]
    );
}

/// One training step as the drafter worker does it: forward, chunked loss + backward, gradient
/// mean across replicas, clip, AdamW.
fn dp_step(
    drafter: &Drafter,
    opt: &mut dflash_top::engine::train::optim::AdamW,
    replicas: &mut dyn dflash_top::engine::train::grad_mean::GradMean,
    head: &Tensor,
    batch: &DpBatch,
) -> f64 {
    let out = drafter.forward(
        &batch.hidden,
        &batch.pos,
        &batch.emb,
        &batch.block_pos,
        &batch.mask,
    );
    let w = slot_weights(4, gamma_for(4));
    let (_loss, backward) = chunked_loss_backward(&out, head, &batch.labels, &batch.valid, &w, 64);
    backward();
    replicas.mean(opt).unwrap();
    let norm = f64::try_from(opt.clip_grad_norm(1.0)).unwrap();
    opt.step(1e-2);
    norm
}

struct DpBatch {
    hidden: Tensor,
    pos: Tensor,
    emb: Tensor,
    block_pos: Tensor,
    mask: Tensor,
    labels: Tensor,
    valid: Tensor,
}

impl DpBatch {
    fn row(&self, r: i64) -> DpBatch {
        let n = |t: &Tensor| t.narrow(0, r, 1);
        DpBatch {
            hidden: n(&self.hidden),
            pos: n(&self.pos),
            emb: n(&self.emb),
            block_pos: n(&self.block_pos),
            mask: n(&self.mask),
            labels: n(&self.labels),
            valid: n(&self.valid),
        }
    }
}

#[test]
fn two_replicas_stay_identical_and_match_one_drafter_with_twice_the_batch() {
    use dflash_top::engine::model::shapes::drafter_spec_for;
    use dflash_top::engine::parallel::replicas::LocalGroup;
    use dflash_top::engine::train::grad_mean::Single;
    use dflash_top::engine::train::optim::AdamW;
    tch::manual_seed(11);
    let (cfg, _) = tiny();
    let spec = drafter_spec_for(&cfg, 1, 511, 4);
    let (b, s, v) = (2, 24, cfg.vocab_size);
    let head = Tensor::randn([v, cfg.hidden_size], (Kind::Float, Device::Cpu)) * 0.3;
    let ids = Tensor::randint(500, [b, s], (Kind::Int64, Device::Cpu));
    let docs = Tensor::zeros([b, s], (Kind::Int64, Device::Cpu));
    let pos = Tensor::arange(s, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([b, 1]);
    // Both rows have the same anchors, so each replica's loss has the same weight sum and the
    // mean of their gradients is the gradient of the two-row loss.
    let a = Anchors {
        pos: Tensor::from_slice(&[3i64, 9, 3, 9]).view([2, 2]),
        valid: Tensor::ones([2, 2], (Kind::Bool, Device::Cpu)),
        count: 4,
    };
    let lmask = Tensor::ones([b, s], (Kind::Bool, Device::Cpu));
    let (labels, valid) = block_labels(&ids, &docs, &lmask, &a, 4);
    let block_ids = block_input_ids(&ids, &a, 4, 511);
    let batch = DpBatch {
        hidden: Tensor::randn(
            [b, s, spec.target_layer_ids.len() as i64 * cfg.hidden_size],
            (Kind::Float, Device::Cpu),
        ),
        emb: Tensor::embedding(&head, &block_ids, -1, false, false),
        block_pos: block_positions(&pos, &a, 4),
        mask: block_mask(&docs, &a, 4),
        pos,
        labels,
        valid,
    };
    // Every copy starts from the same weights (copied, not re-drawn: tests share the global RNG).
    let template = VarStore::new(Device::Cpu);
    let _template_model = Drafter::new(&template.root(), &spec);
    let fresh = || {
        let mut vs = VarStore::new(Device::Cpu);
        let d = Drafter::new(&vs.root(), &spec);
        vs.copy(&template).unwrap();
        let opt = AdamW::new(vs.variables().into_iter().collect());
        (vs, d, opt)
    };
    // One drafter, both rows.
    let (single_vs, single, mut single_opt) = fresh();
    let single_norms: Vec<f64> = (0..3)
        .map(|_| dp_step(&single, &mut single_opt, &mut Single, &head, &batch))
        .collect();
    // Two replicas, one row each, averaging gradients.
    let group = LocalGroup::new(2, dflash_top::cancel::CancelToken::new());
    // Built here, one after the other: the seeded generator is global.
    let built: Vec<_> = (0..2).map(|_| fresh()).collect();
    let replicas: Vec<(VarStore, Vec<f64>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = built
            .into_iter()
            .enumerate()
            .map(|(r, (vs, d, mut opt))| {
                let mut member = group.member(r);
                let row = batch.row(r as i64);
                let head = head.shallow_clone();
                std::thread::Builder::new()
                    .name(format!("replica-{r}"))
                    .spawn_scoped(sc, move || {
                        let norms: Vec<f64> = (0..3)
                            .map(|_| dp_step(&d, &mut opt, &mut member, &head, &row))
                            .collect();
                        (vs, norms)
                    })
                    .unwrap()
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The averaged gradient is the two-row gradient (a sum would have twice its norm).
    for (rank, (_, norms)) in replicas.iter().enumerate() {
        for (k, (a, b)) in norms.iter().zip(&single_norms).enumerate() {
            assert!(
                (a - b).abs() < 1e-4 * b.max(1.0),
                "replica {rank} step {k}: grad norm {a} vs {b}"
            );
        }
    }
    let (r0, r1) = (replicas[0].0.variables(), replicas[1].0.variables());
    let single_vars = single_vs.variables();
    for (name, t) in &r0 {
        assert!(t.equal(&r1[name]), "replicas differ in {name}");
        // Float rounding of the split sums, amplified by Adam for tiny gradients: well under lr.
        let d = f64::try_from((t - &single_vars[name]).abs().max()).unwrap();
        assert!(
            d < 1e-4,
            "{name}: replicas and the single drafter differ by {d}"
        );
    }
}

#[test]
fn a_fresh_drafter_is_initialised_as_dflash_draft_model() {
    tch::manual_seed(5);
    let (_, spec) = tiny();
    let vs = VarStore::new(Device::Cpu);
    let _d = Drafter::new(&vs.root(), &spec);
    let vars = vs.variables();
    let mut linears = 0;
    for (name, t) in &vars {
        let std = f64::try_from(t.std(true)).unwrap();
        let mean = f64::try_from(t.mean(Kind::Float)).unwrap();
        if name.ends_with("norm.weight") {
            assert!(
                t.eq(1.0).all().int64_value(&[]) == 1,
                "{name}: norms start at 1"
            );
        } else {
            // normal(0, initializer_range = 0.02), as transformers' _init_weights.
            assert!((std - 0.02).abs() < 0.002, "{name}: std {std}");
            assert!(mean.abs() < 0.002, "{name}: mean {mean}");
            linears += 1;
        }
    }
    // fc + 7 projections per layer.
    assert_eq!(linears, 1 + 7 * spec.layers.num_hidden_layers as usize);
    assert!(vars.contains_key("hidden_norm.weight") && vars.contains_key("fc.weight"));
}

#[test]
fn chat_lines_go_through_the_tokenizers_own_chat_template() {
    use dflash_top::engine::data::jsonl::JsonlSource;
    let dir = tempfile::tempdir().unwrap();
    let tok = word_tokenizer(dir.path());
    // Not ChatML: a "there" before every assistant answer, Python's str.strip, raise_exception,
    // and HF's trim_blocks / lstrip_blocks.
    let template = r#"{% for m in messages %}
    {% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}
    {{ '<|im_start|>' + m.role + ' ' }}{% if m.role == 'assistant' %}{{ 'there ' }}{% endif %}
{{ m.content.strip() + '<|im_end|>' }}
{% endfor %}"#;
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let data = dir.path().join("chat.jsonl");
    std::fs::write(
        &data,
        r#"{"messages": [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": " fine "}]}"#,
    )
    .unwrap();
    let mut src = JsonlSource::open(&data, with_tokenizer(&tok)).unwrap();
    let chat = src.next_doc().unwrap();
    // <|im_start|> user how are you <|im_end|> <|im_start|> assistant there fine <|im_end|>
    assert_eq!(chat.ids, vec![1, 3, 7, 8, 9, 2, 1, 4, 6, 10, 2]);
    assert_eq!(
        chat.loss_mask,
        vec![false, false, false, false, false, false, false, false, false, true, true],
        "loss on the answer and its end token, not on the template's own words"
    );
    // A template error is a sentence naming the file.
    std::fs::write(
        &data,
        r#"{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "fine"}]}"#,
    )
    .unwrap();
    let e = format!(
        "{:#}",
        JsonlSource::open(&data, with_tokenizer(&tok))
            .err()
            .unwrap()
    );
    assert!(
        e.contains("tokenizer_config.json") && e.contains("bad role"),
        "{e}"
    );
}

/// RMSNorm through libtorch's fused kernel on CUDA in bf16 against the fp32 formula (Qwen3's),
/// forward and the input's gradient. Runs where a GPU is; without one it says so.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn rms_norm_on_cuda_in_bf16_matches_the_fp32_formula() {
    use dflash_top::engine::model::layers::RmsNorm;
    let Some(dev) = crate::cuda_or_skip("the fused RMSNorm") else {
        return;
    };
    let vs = VarStore::new(dev);
    let mut norm = RmsNorm::new(vs.root() / "n", 256, 1e-6);
    tch::no_grad(|| {
        norm.weight
            .copy_(&(Tensor::rand([256], (Kind::Float, dev)) + 0.5));
    });
    let x = (Tensor::randn([64, 256], (Kind::Float, dev)) * 3.0).set_requires_grad(true);
    let xb = x.to_kind(Kind::BFloat16);
    let fused = norm.forward(&xb);
    assert_eq!(fused.kind(), Kind::BFloat16);
    let var = x.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
    let plain = &x * (var + 1e-6).rsqrt() * &norm.weight;
    let d = f64::try_from((fused.to_kind(Kind::Float) - &plain).abs().max()).unwrap();
    let scale = f64::try_from(plain.abs().max()).unwrap();
    assert!(d < 0.01 * scale, "forward differs by {d} (scale {scale})");
    let gx_fused = Tensor::run_backward(
        &[fused.to_kind(Kind::Float).sum(Kind::Float)],
        &[&x],
        true,
        false,
    );
    let gx_plain = Tensor::run_backward(&[plain.sum(Kind::Float)], &[&x], false, false);
    let gd = f64::try_from((&gx_fused[0] - &gx_plain[0]).abs().max()).unwrap();
    let gscale = f64::try_from(gx_plain[0].abs().max()).unwrap();
    assert!(
        gd < 0.02 * gscale,
        "gradient differs by {gd} (scale {gscale})"
    );
}

/// The loss takes its rows from the host (no read-back from the device): they must be exactly
/// the labels `block_labels` marks valid, on packed rows of several documents with padding.
#[test]
fn host_label_rows_are_the_valid_labels() {
    use dflash_top::engine::data::Synthetic;
    let (rows, seq, block) = (3i64, 96i64, 8usize);
    let mut src = Synthetic::new(5, 400, 70);
    let b = Packer::new().pack(&mut src, rows, seq).unwrap();
    let mut rng = Rng::new(9);
    let per_row: Vec<Vec<i64>> = (0..rows as usize)
        .map(|r| {
            let span = r * seq as usize..(r + 1) * seq as usize;
            sample_anchors(
                &b.host_doc_ids[span.clone()],
                &b.host_loss_mask[span],
                12,
                AnchorScope::PerRow,
                &mut rng,
            )
        })
        .collect();
    let width = 16;
    let anch = anchors_tensor(&per_row, width, Device::Cpu);
    let (_, valid) = block_labels(&b.input_ids, &b.doc_ids, &b.loss_mask, &anch, block as i64);
    let device_rows = Vec::<i64>::try_from(valid.view([-1]).nonzero().squeeze_dim(1)).unwrap();
    let host_rows = label_rows(
        &per_row,
        width,
        block,
        &b.host_doc_ids,
        &b.host_loss_mask,
        seq as usize,
    );
    assert!(
        device_rows.len() > 50,
        "enough labels to compare: {}",
        device_rows.len()
    );
    assert_eq!(host_rows, device_rows);
}

#[test]
fn jsonl_documents_come_shuffled_per_epoch_and_skip_lands_where_reading_would() {
    use dflash_top::engine::data::jsonl::JsonlOptions;
    use dflash_top::engine::data::jsonl::JsonlSource;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    let lines: Vec<String> = (0..7)
        .map(|d| serde_json::json!({ "input_ids": [d, d] }).to_string())
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let open = |seed| {
        let opts = JsonlOptions {
            seed: Some(seed),
            ..JsonlOptions::new(16)
        };
        JsonlSource::open(&data, opts).unwrap()
    };
    let mut src = open(3);
    let epoch = |s: &mut JsonlSource| -> Vec<i64> {
        (0..7).map(|_| s.next_doc().unwrap().ids[0]).collect()
    };
    let (first, second) = (epoch(&mut src), epoch(&mut src));
    for e in [&first, &second] {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..7).collect::<Vec<_>>(),
            "an epoch visits each document once"
        );
    }
    assert_ne!(first, second, "each epoch has its own order");
    assert_ne!(first, (0..7).collect::<Vec<_>>(), "not the file's order");
    assert_eq!(epoch(&mut open(3)), first, "the seed decides the order");
    // Skipping n documents (a resumed run) lands where reading n would, across epochs.
    let mut read = open(3);
    let mut skipped = open(3);
    for _ in 0..10 {
        read.next_doc().unwrap();
    }
    skipped.skip(4).unwrap();
    skipped.skip(6).unwrap();
    for _ in 0..9 {
        assert_eq!(read.next_doc().unwrap(), skipped.next_doc().unwrap());
    }
}

/// `lines` joined as a JSONL file `name` in `dir`.
fn jsonl_file(dir: &std::path::Path, name: &str, lines: &[String]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn jsonl_streams_a_bad_line_far_in_fails_only_when_reached_with_file_and_line() {
    use dflash_top::engine::data::jsonl::JsonlOptions;
    use dflash_top::engine::data::jsonl::JsonlSource;
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..3000i64)
        .map(|d| serde_json::json!({ "input_ids": [d % 500, 1, 2, 3, 4, 5] }).to_string())
        .collect();
    lines.push(r#"{"input_ids": [1, 2"#.into());
    let data = jsonl_file(dir.path(), "big.jsonl", &lines);
    for threads in [0, 2] {
        let opts = JsonlOptions {
            threads,
            ..JsonlOptions::new(512)
        };
        let mut src = JsonlSource::open(&data, opts).unwrap();
        let b = Packer::new().pack(&mut src, 2, 32).unwrap();
        assert_eq!(b.docs_placed, 10, "5 documents of 6 in a row of 32");
        let parsed = src.lines_parsed();
        assert!(
            parsed < 100,
            "{threads} threads: {parsed} lines parsed for the first batch"
        );
        // The stream reaches the bad line after the 3,000 good ones (the file's order); the
        // packer took 11 so far (one waits for the next row).
        let mut good = src.position();
        let e = loop {
            match src.next_doc() {
                Ok(_) => good += 1,
                Err(e) => break format!("{e:#}"),
            }
        };
        assert_eq!(good, 3000, "{threads} threads");
        assert!(
            e.contains("big.jsonl line 3001") && e.contains("not valid JSON"),
            "{e}"
        );
    }
}

#[test]
fn reading_threads_and_skips_give_the_same_stream_with_the_same_drops() {
    use dflash_top::engine::data::jsonl::JsonlOptions;
    use dflash_top::engine::data::jsonl::JsonlSource;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    // Documents of 2 to 8 tokens, loss from token 3: those under 4 loss tokens are dropped;
    // every 7th line is blank, every 11th has one token.
    let lines: Vec<String> = (0..60i64)
        .map(|d| match d {
            _ if d % 7 == 3 => String::new(),
            _ if d % 11 == 5 => serde_json::json!({ "input_ids": [d] }).to_string(),
            _ => {
                let n = 2 + d % 7;
                let ids: Vec<i64> = (0..n).map(|i| d * 8 + i).collect();
                let mask: Vec<u8> = (0..n).map(|i| (i >= 3) as u8).collect();
                serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string()
            }
        })
        .collect();
    let data = jsonl_file(dir.path(), "mixed.jsonl", &lines);
    let open = |threads| {
        let dropped = Arc::new(AtomicU64::new(0));
        let tell = dropped.clone();
        let opts = JsonlOptions {
            min_loss_tokens: 4,
            seed: Some(5),
            threads,
            on_dropped: Some(Box::new(move |n| {
                tell.fetch_add(n, Ordering::Relaxed);
            })),
            ..JsonlOptions::new(512)
        };
        (JsonlSource::open(&data, opts).unwrap(), dropped)
    };
    // 100 documents: 14 of the 60 lines are kept, so over seven epochs.
    let read = |src: &mut JsonlSource, n| -> Vec<(Vec<i64>, u64)> {
        (0..n)
            .map(|_| (src.next_doc().unwrap().ids, src.position()))
            .collect()
    };
    let (mut inline, dropped_inline) = open(0);
    let (mut ahead, dropped_ahead) = open(3);
    let a = read(&mut inline, 100);
    assert_eq!(a, read(&mut ahead, 100), "the threads change nothing");
    assert!(
        a.iter().all(|(ids, _)| ids.len() >= 7),
        "short loss dropped"
    );
    assert!(a[99].1 > 360, "seven epochs: {}", a[99].1);
    let dropped = dropped_inline.load(Ordering::Relaxed);
    assert!(dropped > 30, "{dropped}");
    assert_eq!(dropped, dropped_ahead.load(Ordering::Relaxed));
    // A resumed stream skips to a saved position and goes on as the first did.
    for threads in [0, 2] {
        let (mut resumed, _) = open(threads);
        resumed.skip(a[39].1).unwrap();
        assert_eq!(read(&mut resumed, 60), a[40..], "{threads} threads");
    }
}
