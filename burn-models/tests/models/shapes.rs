//! Parameter counts and forward shapes of both models, on the CPU (Flex) backend.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Distribution, Tensor};
use burn_models::{MobileNetConfig, MobileNetError, RunContext, SimpleModelConfig};

type B = Flex;

#[test]
fn simple_model_has_the_articles_parameter_count() {
    // 3·64·9 + 64 (conv) + 64·16·16·10 + 10 (linear)
    let model = SimpleModelConfig::new().init::<B>(&Default::default());
    assert_eq!(model.trainable_params(), 165_642);
}

#[test]
fn simple_model_forward_shape() {
    let device = Default::default();
    let model = SimpleModelConfig::new().init::<B>(&device);
    let x = Tensor::<B, 4>::random([5, 3, 32, 32], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [5, 10]);
}

/// Table 6 of Howard et al. (224×224, 1000 classes): millions of parameters per α.
#[test]
fn mobilenet_parameter_counts_match_the_paper() {
    for (alpha, millions) in [(1.0, 4.2), (0.75, 2.6), (0.5, 1.3), (0.25, 0.5)] {
        let config = MobileNetConfig::new().with_width_multiplier(alpha);
        let params = config
            .init::<B>(&Default::default())
            .unwrap()
            .trainable_params();
        let rounded = (params as f64 / 1e5).round() / 10.0;
        assert_eq!(rounded, millions, "α = {alpha}: {params} parameters");
    }
}

/// Keras' `MobileNet(alpha=1.0)` (same layout, bias-free convs) reports 4,253,864 params in
/// all, 4,231,976 trainable; the 21,888 others are the batch norms' running mean and variance.
#[test]
fn mobilenet_exact_count_matches_keras() {
    let model = MobileNetConfig::new()
        .init::<B>(&Default::default())
        .unwrap();
    assert_eq!(model.trainable_params(), 4_231_976);
    assert_eq!(model.num_params(), 4_253_864);
}

#[test]
fn mobilenet_forward_shapes() {
    let device = Default::default();
    let cifar = MobileNetConfig::cifar().with_width_multiplier(0.25);
    let model = cifar.init::<B>(&device).unwrap();
    let x = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [2, 10]);

    let imagenet = MobileNetConfig::new()
        .with_width_multiplier(0.25)
        .with_num_classes(7);
    let model = imagenet.init::<B>(&device).unwrap();
    let x = Tensor::<B, 4>::random([1, 3, 96, 96], Distribution::Default, &device);
    assert_eq!(model.forward(x, &RunContext::default()).dims(), [1, 7]);
}

#[test]
fn mobilenet_rejects_bad_configs() {
    let device = Default::default();
    let bad = MobileNetConfig::new().with_width_multiplier(0.0);
    assert_eq!(
        bad.init::<B>(&device).unwrap_err(),
        MobileNetError::WidthMultiplier(0.0)
    );
    let bad = MobileNetConfig::new().with_stem_stride(3);
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "stem_stride must be 1 or 2, got 3"
    );
}
